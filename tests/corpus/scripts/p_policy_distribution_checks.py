"""A policy-gradient update (REINFORCE with a baseline) that builds a Categorical from the
policy's logits at every step; torch.distributions checks its arguments by default, which
reads device values back to the host at construction and in log_prob.
Fix: Categorical(logits=logits, validate_args=False), or
torch.distributions.Distribution.set_default_validate_args(False) once at start-up."""
import torch
from torch import nn
from torch.distributions import Categorical

torch.manual_seed(0)
policy = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 4)).to("tpu")
opt = torch.optim.Adam(policy.parameters(), lr=3e-4)
obs_all = torch.randn(10, 64, 8)
act_all = torch.randint(0, 4, (10, 64))
ret_all = torch.randn(10, 64)
for step in range(10):
    obs, actions, returns = obs_all[step].to("tpu"), act_all[step].to("tpu"), ret_all[step].to("tpu")
    dist = Categorical(logits=policy(obs))  # EXPECT: implicit_sync
    logp = dist.log_prob(actions)  # EXPECT: implicit_sync
    advantage = returns - returns.mean()
    loss = -(logp * advantage).mean() - 0.01 * dist.entropy().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", loss.item())

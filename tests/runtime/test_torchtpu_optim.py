"""TorchTPU's AdamW against ``torch.optim.AdamW`` on CPU step by step, and its bounded dynamism
(``mark_dynamic``): one captured graph for every size in the bounds."""

from __future__ import annotations

import copy

import pytest
import torch
from tpu_debug.core.errors import TpuArgumentError


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


@pytest.mark.parametrize("options", [{}, {"amsgrad": True, "weight_decay": 0.1, "maximize": True}])
def test_adamw_steps_as_torch_optim_adamw(options):
    from torch_tpu._internal import optim

    reference = _model()
    model = copy.deepcopy(reference).to("tpu")
    ours = optim.AdamW(model.parameters(), lr=1e-2, **options)
    theirs = torch.optim.AdamW(reference.parameters(), lr=1e-2, **options)
    # the state is there before the first step (TorchTPU makes it up front)
    first = ours.state[next(model.parameters())]
    expected = {"step", "exp_avg", "exp_avg_sq"} | ({"max_exp_avg_sq"} if options.get("amsgrad") else set())
    assert set(first) == expected and first["exp_avg"].device.type == "tpu" and first["step"].item() == 0
    optim.patch_optimizer_graph_breaks()  # nothing to patch here
    for step in range(4):
        x = torch.randn(5, 8)
        for net, opt, inputs in ((reference, theirs, x), (model, ours, x.to("tpu"))):
            opt.zero_grad()
            net(inputs).pow(2).mean().backward()
            opt.step()
        for got, want in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-6,
                                       msg=lambda m, s=step: f"step {s}: {m}")
    assert ours.state[next(model.parameters())]["step"].item() == 4
    optim.unpatch_optimizer_graph_breaks()


def test_mark_dynamic_gives_one_graph_for_the_bounded_sizes():
    import torch._dynamo.testing
    from torch_tpu._internal import dynamism

    def decode(kv: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        return torch.cat([kv, new], dim=2).softmax(-1).sum(-1)

    counter = torch._dynamo.testing.CompileCounterWithBackend("tpu")
    compiled = torch.compile(decode, backend=counter)
    new = torch.randn(1, 2, 1, 4)
    for length in range(8, 13):  # a KV cache growing by one each decode step
        kv = torch.randn(1, 2, length, 4)
        on_tpu = kv.to("tpu")
        dynamism.mark_dynamic(on_tpu, dimension=2, lower_bound=8, upper_bound=16)
        torch.testing.assert_close(compiled(on_tpu, new.to("tpu")).cpu(), decode(kv, new))
    assert counter.frame_count == 1  # one graph captured for the five sizes
    assert dynamism.get_dynamism_info(on_tpu) == [dynamism.BoundedDynamicDimension(2, 8, 16)]
    assert dynamism.get_dynamism_info(torch.ones(3, device="tpu")) == []
    with pytest.raises(TpuArgumentError, match=r"^mark_dynamic: dimension 2 has size 12; the bounds must hold it"):
        dynamism.mark_dynamic(on_tpu, dimension=2, lower_bound=1, upper_bound=4)
    with pytest.raises(TpuArgumentError, match=r"^mark_dynamic: tensor is not on the tpu device$"):
        dynamism.mark_dynamic(kv, dimension=2, lower_bound=8, upper_bound=16)

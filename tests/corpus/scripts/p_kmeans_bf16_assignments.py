"""k-means on embeddings, run under TPU numerics: the distances are a float32 matmul, which a
TPU computes in bfloat16 passes at its default precision, and the nearest centroid of many
points changes with it.
Fix: compute the distances at full precision (torch.tpu.precision.set('highest') around the
assignment, or torch.set_float32_matmul_precision('highest')), or centre the embeddings first.
# corpus-options: --numerics tpu --divergence
"""
import torch

torch.manual_seed(0)
emb = torch.randn(512, 32) * 0.05 + 3.0
emb = emb.to("tpu")
centroids = emb[torch.randperm(512)[:16]].clone()
for it in range(3):
    d = (emb * emb).sum(1, keepdim=True) - 2 * emb @ centroids.T + (centroids * centroids).sum(1)
    assign = d.argmin(dim=1)  # EXPECT: divergence
    counts = torch.zeros(16, device=emb.device).index_add_(0, assign, torch.ones(512, device=emb.device))
    sums = torch.zeros_like(centroids).index_add_(0, assign, emb)
    centroids = sums / counts.clamp(min=1).unsqueeze(1)
print("inertia", d.min(dim=1).values.sum().item())

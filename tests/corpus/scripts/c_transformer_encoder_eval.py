"""Inference with a small nn.TransformerEncoder in eval mode under no_grad, compiled, over padded
batches: PyTorch takes its fused encoder fast path (aten::_transformer_encoder_layer_fwd).
# corpus: correct
"""
import torch
from torch import nn

torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval().to("tpu")
classifier = nn.Linear(64, 3).to("tpu")
fast = torch.compile(encoder, backend="tpu_debug")
tokens = torch.randn(6, 4, 12, 64)
lengths = torch.tensor([12, 9, 12, 7])
pad = (torch.arange(12)[None, :] >= lengths[:, None]).to("tpu")
counts = torch.zeros(3, device="tpu")
with torch.no_grad():
    for batch in tokens:
        hidden = fast(batch.to("tpu"), src_key_padding_mask=pad)
        pred = classifier(hidden[:, 0]).argmax(dim=-1)
        counts += torch.nn.functional.one_hot(pred, 3).sum(dim=0)
print("predictions per class", counts.tolist())

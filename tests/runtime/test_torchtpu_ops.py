"""TorchTPU's ``torch.ops.torch_tpu`` ops (runtime/torchtpu/ops.py) against CPU PyTorch: ``ragged_dot``,
the grouped matmul of the mixture-of-experts layers in TorchTPU's Gemma 4 and benchmark examples,
forward, backward and compiled, against one CPU matmul per group."""

from __future__ import annotations

import pytest
import torch


def _grouped(lhs: torch.Tensor, rhs: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    # the reference: each group's rows times its matrix, the rows past the groups zeros
    rows, start = [], 0
    for group, size in enumerate(sizes):
        rows.append(lhs[start:start + size] @ rhs[group])
        start += size
    return torch.cat([*rows, torch.zeros(lhs.size(0) - start, rhs.size(2))])


def test_ragged_dot_is_a_matmul_per_group_forward_and_backward():
    g = torch.Generator().manual_seed(0)
    sizes = [3, 0, 4, 2]  # an expert with no tokens; one row past the groups
    lhs = torch.randn(10, 8, generator=g, requires_grad=True)
    rhs = torch.randn(4, 8, 6, generator=g, requires_grad=True)
    weight = torch.randn(10, 6, generator=g)
    expected = _grouped(lhs, rhs, sizes)
    (expected * weight).sum().backward()

    on_tpu = lhs.detach().to("tpu").requires_grad_(), rhs.detach().to("tpu").requires_grad_()
    group_sizes = torch.tensor(sizes, dtype=torch.int32)
    out = torch.ops.torch_tpu.ragged_dot(*on_tpu, group_sizes.to("tpu"))
    (out * weight.to("tpu")).sum().backward()
    torch.testing.assert_close(out.cpu(), expected.detach())
    torch.testing.assert_close(on_tpu[0].grad.cpu(), lhs.grad)
    torch.testing.assert_close(on_tpu[1].grad.cpu(), rhs.grad)
    # CPU tensors (Gemma 4's model picks the op whenever hasattr finds it)
    torch.testing.assert_close(torch.ops.torch_tpu.ragged_dot(lhs, rhs, group_sizes), expected)
    compiled = torch.compile(lambda a, b, s: torch.ops.torch_tpu.ragged_dot(a, b, s), backend="tpu")
    torch.testing.assert_close(compiled(on_tpu[0].detach(), on_tpu[1].detach(), group_sizes.to("tpu")).cpu(),
                               expected.detach())


def test_ragged_dot_checks_its_shapes():
    with pytest.raises(RuntimeError, match=r"ragged_dot: lhs \(4, 3\), rhs \(2, 5, 6\) and group_sizes \(2,\) do not"):
        torch.ops.torch_tpu.ragged_dot(torch.ones(4, 3), torch.ones(2, 5, 6), torch.tensor([2, 2]))

"""Views alias their base: a write through any view is seen by the base and the
other views, and a write to the base is seen by the views."""

from __future__ import annotations

import pytest
import torch

VIEWS = {
    "view": lambda t: t.view(6, 4),
    "reshape_viewing": lambda t: t.reshape(24),
    "t": lambda t: t[0].t(),
    "transpose": lambda t: t.transpose(0, 2),
    "permute": lambda t: t.permute(2, 0, 1),
    "slice": lambda t: t[:, 1:3],
    "slice_step": lambda t: t[..., ::2],
    "select": lambda t: t[1],
    "select_neg": lambda t: t[:, -1],
    "narrow": lambda t: t.narrow(2, 1, 2),
    "diagonal": lambda t: t[0].diagonal(),
    "unbind": lambda t: t.unbind(1)[2],
    "expand": lambda t: t[:, :1, :1].expand(2, 3, 4),
    "squeeze": lambda t: t[:, :1].squeeze(1),
    "unsqueeze": lambda t: t.unsqueeze(0),
    "as_strided": lambda t: t.as_strided((3, 2), (4, 2), 1),
    "unfold": lambda t: t[0, 0].unfold(0, 2, 2),  # non-overlapping: overlapping in-place writes are undefined in PyTorch
    "split": lambda t: t.split(1, dim=1)[1],
    "chunk": lambda t: t.chunk(2, dim=2)[1],
    "detach": lambda t: t.detach(),
    "flatten": lambda t: t.flatten(),
    "movedim": lambda t: t.movedim(0, 2),
    "view_as": lambda t: t.view_as(torch.empty(4, 6)),
    "indexing_none": lambda t: t[None, 1, :, 2],
}

BASE = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)


def _pair(name):
    cpu = BASE.clone()
    dev = BASE.clone().to("tpu")
    return cpu, VIEWS[name](cpu), dev, VIEWS[name](dev)


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_shares_storage_and_values(name):
    cpu, cv, dev, dv = _pair(name)
    assert dv.shape == cv.shape and dv.stride() == cv.stride()
    assert dv.storage_offset() == cv.storage_offset()
    assert dv.untyped_storage()._cdata == dev.untyped_storage()._cdata
    torch.testing.assert_close(dv.cpu(), cv)


# an expanded view has elements that share memory: PyTorch refuses in-place writes to
# it, so there is no CPU result to compare a write through it with
@pytest.mark.parametrize("name", sorted(set(VIEWS) - {"expand"}))
def test_write_through_view_reaches_base(name):
    cpu, cv, dev, dv = _pair(name)
    cv.mul_(-1).add_(0.5)
    dv.mul_(-1).add_(0.5)
    torch.testing.assert_close(dev.cpu(), cpu)
    torch.testing.assert_close(dv.cpu(), cv)


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_write_to_base_reaches_view(name):
    cpu, cv, dev, dv = _pair(name)
    cpu.add_(100)
    dev.add_(100)
    torch.testing.assert_close(dv.cpu(), cv)
    cpu[0].zero_()
    dev[0].zero_()
    torch.testing.assert_close(dv.cpu(), cv)


def test_write_seen_by_sibling_views():
    dev = torch.zeros(4, 4, device="tpu")
    row = dev[1]
    col = dev[:, 2]
    row.fill_(3.0)
    assert col.cpu().tolist() == [0.0, 3.0, 0.0, 0.0]
    col.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert row.cpu().tolist() == [3.0, 3.0, 2.0, 3.0]


def test_setitem_forms():
    cpu = torch.zeros(3, 4)
    dev = cpu.to("tpu")
    for target in (cpu, dev):
        target[0] = 1.0
        target[1, 2] = 5.0
        target[:, 3] = torch.tensor([7.0, 8.0, 9.0], device=target.device)
        target[2, :2] += 4
    torch.testing.assert_close(dev.cpu(), cpu)


def test_copy_is_independent():
    dev = torch.ones(3, device="tpu")
    c = dev.clone()
    c.add_(1)
    assert dev.cpu().tolist() == [1.0, 1.0, 1.0]
    assert c.cpu().tolist() == [2.0, 2.0, 2.0]


def test_out_variant_resizes_and_writes():
    a = torch.arange(6.0).reshape(2, 3)
    out_cpu = torch.empty(0)
    out_dev = torch.empty(0, device="tpu")
    torch.add(a, 1, out=out_cpu)
    torch.add(a.to("tpu"), 1, out=out_dev)
    assert out_dev.shape == (2, 3)
    torch.testing.assert_close(out_dev.cpu(), out_cpu)


def test_out_variant_into_view():
    base = torch.zeros(3, 4, device="tpu")
    torch.mul(torch.ones(4, device="tpu"), 2, out=base[1])
    assert base.cpu()[1].tolist() == [2.0] * 4 and base.cpu().sum().item() == 8.0


def test_inplace_dtype_error_is_pytorchs():
    # PyTorch's own meta kernel rejects the call, with PyTorch's message
    with pytest.raises(RuntimeError, match=r"in-place ops are not possible|can't be cast to the desired output type Long"):
        torch.ones(2, dtype=torch.int64, device="tpu").add_(1.5)


# ---- views that reinterpret complex storage --------------------------------------------


def test_view_as_real_and_complex_read_and_write_through():
    """``view_as_real`` sees a complex storage as (real, imaginary) pairs and
    ``view_as_complex`` a float storage as complex numbers: reads and in-place writes
    through either reach the base, strided views of them included."""
    c = torch.randn(3, 4, dtype=torch.complex64)
    dev = c.to("tpu")
    real = torch.view_as_real(dev)
    torch.testing.assert_close(real.cpu(), torch.view_as_real(c))
    torch.testing.assert_close(real[..., 1].cpu(), c.imag)
    real.mul_(2)
    real[:, 1:3, 0].zero_()
    ref = c.clone()
    torch.view_as_real(ref).mul_(2)
    torch.view_as_real(ref)[:, 1:3, 0].zero_()
    torch.testing.assert_close(dev.cpu(), ref)
    # a flat view of the pairs has as many elements as the complex storage: still float
    torch.testing.assert_close(torch.view_as_real(dev).reshape(-1)[:12].cpu(), torch.view_as_real(ref).reshape(-1)[:12])

    x = torch.randn(3, 4, 2)
    dev_x = x.to("tpu")
    as_complex = torch.view_as_complex(dev_x)
    torch.testing.assert_close(as_complex.cpu(), torch.view_as_complex(x))
    as_complex.mul_(1j)
    torch.view_as_complex(x).mul_(1j)
    torch.testing.assert_close(dev_x.cpu(), x)


def test_rotary_embedding_through_complex_views_trains():
    """Meta's Llama applies rotary embeddings as complex products on view_as_complex of the
    query and view_as_real of the result; forward and gradient match CPU."""
    xq = torch.randn(2, 5, 4, 8)
    freqs = torch.polar(torch.ones(5, 4), torch.randn(5, 4))

    def rope(x, f):
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * f[None, :, None, :]).flatten(3)

    ref_x, dev_x = xq.clone().requires_grad_(), xq.to("tpu").requires_grad_()
    ref, got = rope(ref_x, freqs), rope(dev_x, freqs.to("tpu"))
    # one complex product per element, rounded the same way on both sides
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-6, atol=1e-6)
    ref.square().sum().backward()
    got.square().sum().backward()
    torch.testing.assert_close(dev_x.grad.cpu(), ref_x.grad, rtol=1e-5, atol=1e-5)

"""Type promotion follows PyTorch (not jnp), Python scalars and 0-dim tensors included."""

from __future__ import annotations

import itertools

import pytest
import torch

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64]
SCALARS = [True, 3, -2, 2.5, 1e-3]
OPS = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "maximum": torch.maximum, "eq": torch.eq, "lt": torch.lt, "where": lambda a, b: torch.where(a > 0, a, b),
}


def _value(dtype, shape=(4,)):
    base = torch.tensor([1, 2, 3, 0][: shape[0]] if shape else 2)
    return base.to(dtype).reshape(shape)


@pytest.mark.parametrize("a,b", list(itertools.combinations_with_replacement(DTYPES, 2)))
def test_tensor_tensor_promotion(a, b):
    x, y = _value(a), _value(b)
    for name, op in OPS.items():
        if name == "sub" and torch.bool in (a, b):
            continue  # PyTorch refuses bool subtraction on every device
        ref = op(x, y)
        out = op(x.to("tpu"), y.to("tpu")).cpu()
        assert out.dtype == ref.dtype, (name, a, b)
        torch.testing.assert_close(out, ref, equal_nan=True, msg=f"{name} {a} {b}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scalar", SCALARS)
def test_tensor_python_scalar_promotion(dtype, scalar):
    x = _value(dtype)
    for name in ("add", "mul", "div", "eq", "maximum"):
        op = OPS[name]
        if name == "maximum":
            continue
        ref = op(x, scalar)
        out = op(x.to("tpu"), scalar).cpu()
        assert out.dtype == ref.dtype, (name, dtype, scalar)
        torch.testing.assert_close(out, ref, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_dim_tensor_does_not_promote_category(dtype):
    x = _value(dtype)
    for zero in (torch.tensor(2.5, dtype=torch.float64), torch.tensor(3, dtype=torch.int64)):
        ref = x * zero
        out = (x.to("tpu") * zero.to("tpu")).cpu()
        assert out.dtype == ref.dtype
        torch.testing.assert_close(out, ref, equal_nan=True)


def test_integer_division_and_true_div():
    a = torch.tensor([7, -7, 9], dtype=torch.int64)
    b = torch.tensor([2, 2, -4], dtype=torch.int64)
    for mode in (None, "trunc", "floor"):
        ref = torch.div(a, b, rounding_mode=mode)
        out = torch.div(a.to("tpu"), b.to("tpu"), rounding_mode=mode).cpu()
        assert out.dtype == ref.dtype
        torch.testing.assert_close(out, ref, equal_nan=True)


def test_float_floor_division_matches():
    a = torch.tensor([7.5, -7.5, 1.0, -0.0, 5.0])
    b = torch.tensor([2.0, 2.0, -3.0, 1.0, 0.0])
    torch.testing.assert_close(torch.floor_divide(a.to("tpu"), b.to("tpu")).cpu(), torch.floor_divide(a, b))


def test_jax_defaults_are_untouched():
    import jax.numpy as jnp

    torch.ones(2, dtype=torch.int64, device="tpu").sum()
    assert jnp.arange(3).dtype == jnp.int32  # tpu_debug does not switch on x64 for everyone

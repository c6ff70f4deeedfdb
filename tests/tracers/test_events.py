from __future__ import annotations

import dataclasses

import pytest
from tpu_debug.tracers import events as ev


def test_every_event_is_frozen_slotted_and_has_a_kind():
    assert set(ev.EVENT_TYPES) == {
        "op",
        "compile",
        "transfer",
        "fallback",
        "graph_break",
        "guard_failure",  # issue 5
        "recompile_limit",
        "divergence",
        "internal_error",
    }
    for kind, cls in ev.EVENT_TYPES.items():
        assert cls.kind == kind
        assert cls.__dataclass_params__.frozen
        assert "__slots__" in cls.__dict__
        names = [f.name for f in dataclasses.fields(cls)]
        assert names[:5] == ["id", "ts", "mode", "thread", "location"]


def test_events_cannot_be_changed():
    e = ev.OpEvent(1, 0.5, "eager", 7, None, "mul.Tensor", 1e-5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.name = "add.Tensor"  # type: ignore[misc]
    with pytest.raises((AttributeError, TypeError)):
        e.extra = 1  # type: ignore[attr-defined]


def test_renderings():
    assert ev.ArgInfo("self", (8, 128), "float32").render() == "float32[8,128]"
    assert ev.ArgInfo("dim", static="1").render() == "dim=1"
    diff = ev.KeyDiff("shape", "f32[8,128]", "f32[9,128]", arg_index=0, arg_name="arg0", dims=(0,))
    assert diff.render() == "arg 0: f32[8,128] -> f32[9,128]"
    assert str(ev.SourceLocation("train.py", 12, "step")) == "train.py:12 in step"


def test_unknown_kind_names_the_known_ones():
    with pytest.raises(ValueError, match=r"^unknown event kind 'nope'; known kinds: compile, divergence, "):
        ev.event_type("nope")


def test_schema_version_is_an_int():
    assert isinstance(ev.SCHEMA_VERSION, int) and ev.SCHEMA_VERSION >= 1

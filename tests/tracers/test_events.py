from __future__ import annotations

import dataclasses

import pytest
from tpu_debug.tracers import events as ev


def test_every_event_is_frozen_slotted_and_has_a_kind():
    assert set(ev.EVENT_TYPES) == {
        "op",
        "compile",
        "compile_phase",
        "compile_lines",
        "transfer",
        "fallback",
        "graph_break",
        "guard_failure",
        "recompile_limit",
        "divergence",
        "internal_error",
        "invalid_value",
        "program_memory",
        "program_proto",
        "target_compile",
        "target_step",
        "target_summary",
        "step",
        "wait",
        "materialize",
        "collectives",
        "collective_call",
        "collective_desync",
        "collective_done",
        "memory_step",
        "memory",
        "memory_finding",
        "divergence_summary",
        "tensorboard_summary",
        "dry_run",
        "process",
        "collectives_target",
        "sharding_remat",
        "fit",
    }
    for kind, cls in ev.EVENT_TYPES.items():
        assert cls.kind == kind
        assert cls.__dataclass_params__.frozen
        assert "__slots__" in cls.__dict__
        names = [f.name for f in dataclasses.fields(cls)]
        assert names[:5] == ["id", "ts", "mode", "thread", "location"]


def test_events_cannot_be_changed():
    e = ev.OpEvent(1, 0.5, "eager", 7, None, "mul.Tensor", 1e-5)
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'name'"):
        e.name = "add.Tensor"  # type: ignore[misc]
    # a slotted frozen dataclass refuses a new attribute in __setattr__, whose zero-argument
    # super() fails on slotted classes with the TypeError below (AttributeError naming it elsewhere)
    with pytest.raises((AttributeError, TypeError), match=r"extra|super\(type, obj\)"):
        e.extra = 1  # type: ignore[attr-defined]


def test_renderings():
    assert ev.ArgInfo("self", (8, 128), "float32").render() == "float32[8,128]"
    assert ev.ArgInfo("dim", static="1").render() == "dim=1"
    diff = ev.KeyDiff("shape", "f32[8,128]", "f32[9,128]", arg_index=0, arg_name="arg0", dims=(0,))
    assert diff.render() == "arg 0: f32[8,128] -> f32[9,128]"
    assert str(ev.SourceLocation("train.py", 12, "step")) == "train.py:12 in step"


def test_unknown_kind_names_the_known_ones():
    with pytest.raises(ValueError, match=r"^unknown event kind 'nope'; known kinds: collective_call, collective_desync, collective_done, collectives, collectives_target, compile, compile_lines, compile_phase, divergence, "):
        ev.event_type("nope")


K = ev.KeyDiff


@pytest.mark.parametrize(
    "diff, field",
    [
        (K("shape", "f32[8]", "f32[9]", arg_index=1, arg_name="other", dims=(0,)), "arg 1 'other'"),
        (K("shape", "f32[8]", "f32[9]", arg_index=1, arg_name="arg1", dims=(0,)), "arg 1"),
        (K("dtype", "f32", "bf16", arg_index=0, arg_name="self"), "arg 0 'self' dtype"),
        (K("layout", "0", "1", arg_index=0, arg_name="self", detail="offset"), "arg 0 'self' offset"),
        (K("static", "1", "2", arg_index=1, arg_name="dim"), "static arg 'dim'"),
        (K("scalar", "0.5", "changed", arg_name="lr", source="guard"), "python scalar baked in 'lr'"),
        (K("inputs", "(f32[8])", "(f32[8], f32[8])"), "inputs"),
        (K("precision", "highest", "high", detail="matmul precision"), "matmul precision"),
        (K("grad", "enabled", "disabled", detail="grad mode"), "grad mode"),
        (K("config", "a", "b", detail="numerics"), "numerics"),
        (K("shape", "8", "9", arg_name="x", dims=(0,), source="guard"), "tensor 'x' dim 0"),
        (K("shape", "2", "3", arg_name="x", detail="rank", source="guard"), "tensor 'x' rank"),
        (
            K("layout", "1", "2", arg_name="x", dims=(1,), detail="stride", source="guard"),
            "tensor 'x' stride 1",
        ),
        (
            K("grad", "False", "True", arg_name="x", detail="requires_grad", source="guard"),
            "tensor 'x' requires_grad",
        ),
        (K("guard", "___check_obj_id(L['m'], 7)", "failed", source="guard"), "dynamo guard"),
        (K("key", "g1", "g2", detail="graph code"), "graph code"),
        (K("key", "compiled before", "compiled again"), "key"),
    ],
)
def test_key_diff_labels_follow_from_its_fields(diff, field):
    assert diff.field == field
    assert diff.render() == f"{field}: {diff.before} -> {diff.now}"


def test_key_diff_refuses_what_it_cannot_mean():
    with pytest.raises(ValueError, match=r"^KeyDiff aspect 'arg 0'; use one of shape, dtype, layout, "):
        ev.KeyDiff("arg 0", "f32[8]", "f32[9]")
    with pytest.raises(ValueError, match=r"^KeyDiff source 'dynamo'; use 'key' or 'guard'$"):
        ev.KeyDiff("guard", "x", "failed", source="dynamo")

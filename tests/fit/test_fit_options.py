"""``FitOptions``: the options of ``tpu_debug.fit``, checked when made, the same record the CLI builds
from its flags. Nothing here compiles: every contradiction is refused before a model is built."""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest
from tpu_debug.fit import FitOptions
from tpu_debug.runtime.target.errors import TargetError

import tpu_debug
from tpu_debug.cli import main
from tpu_debug.cli.fit import options_of, prepare_parser

REFUSED = [
    ({"job": "serve"}, r"^job 'serve' is not one of train, forward, prefill, decode$"),
    ({"extrapolate": True}, (r"^a training step is not extended from fewer layers: .* compiled as one loop "
                             r"\(loop=True, the default above 4 layers\) or unrolled \(loop=False\)$")),
    ({"master_dtype": "bfloat16"}, r"^master_dtype 'bfloat16': give 'float32' \(or None: the parameters' dtype\)$"),
    ({"loss": "fused"}, r"^loss 'fused' is not one of plain, chunked$"),
    ({"remat": True, "remat_policy": "offload"},
     r"^remat=True is remat_policy='full': drop remat=True or remat_policy='offload'$"),
    ({"job": "forward", "remat": True},
     r"^loop=True, remat=True and master_dtype shape a training step; job 'forward' has no backward$"),
    ({"job": "decode", "attention": "flash"},
     r"^loop=True, remat=True and master_dtype shape a training step; job 'decode' has no backward$"),
    ({"loop": False, "master_dtype": "float32"},
     r"^remat=True and master_dtype are built into the looped step: drop loop=False$"),
]


@pytest.mark.quick
@pytest.mark.parametrize(("options", "message"), REFUSED, ids=["-".join(o) for o, _ in REFUSED])
def test_contradicting_options_are_refused_when_made(options, message):
    with pytest.raises(TargetError, match=message):
        FitOptions(**options)
    # the function refuses them the same way, before it builds the model (an unknown model name
    # would fail later, in build_config)
    with pytest.raises(tpu_debug.TpuDebugError, match=message):
        tpu_debug.fit("no-such-model", **options)


def test_options_that_agree_are_kept_as_given():
    options = FitOptions(target="v6e-8", plan="fsdp=4,tp=2", batch=16, seq=512, remat_policy="offload",
                         loss="chunked", attention="splash", master_dtype="float32", overrides={"num_hidden_layers": 2})
    assert options.shapes_the_loop and not FitOptions().shapes_the_loop
    assert FitOptions(job="forward", extrapolate=True).extrapolate is True
    assert options.to_dict() == {
        "target": "v6e-8", "plan": "fsdp=4,tp=2", "batch": 16, "seq": 512, "job": "train", "dtype": "bfloat16",
        "overrides": {"num_hidden_layers": 2}, "extrapolate": None, "shard_activations": False,
        "optimization_level": None, "cache": True, "loop": None, "remat": False, "master_dtype": "float32",
        "loss": "chunked", "remat_policy": "offload", "attention": "splash",
    }
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"cannot assign to field 'batch'"):
        options.batch = 32  # type: ignore[misc]


def test_the_function_takes_the_options_as_keywords():
    parameters = inspect.signature(tpu_debug.fit).parameters
    fields = {f.name: f.default for f in dataclasses.fields(FitOptions)}
    assert list(parameters) == ["model_or_config", *fields]
    assert {name: p.default for name, p in parameters.items() if name != "model_or_config"} == fields
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'batch_size'"):
        tpu_debug.fit("tiny-llama", batch_size=8)


def _flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    prepare_parser(parser)
    return parser.parse_args(["tiny-llama", *argv])


def test_the_cli_builds_the_options_from_its_flags():
    assert options_of(_flags()) == FitOptions(overrides={})
    got = options_of(_flags("--target", "v6e-16", "--plan", "dp", "--batch", "32", "--seq", "128", "--job", "train",
                            "--dtype", "float32", "--set", "num_hidden_layers=2", "--optimization-level", "O0",
                            "--shard-activations", "--layers", "loop", "--chunked-loss", "--remat-policy",
                            "all-matmuls", "--attention", "flash", "--master-dtype", "float32"))
    assert got == FitOptions(target="v6e-16", plan="dp", batch=32, seq=128, dtype="float32",
                             overrides={"num_hidden_layers": 2}, optimization_level="O0", shard_activations=True,
                             loop=True, loss="chunked", remat_policy="all-matmuls", attention="flash",
                             master_dtype="float32")
    assert options_of(_flags("--layers", "unrolled")).loop is False
    assert options_of(_flags("--remat")).remat is True


def test_the_cli_refuses_contradicting_flags_with_the_same_text(capsys):
    assert main(["fit", "tiny-llama", "--layers", "unrolled", "--remat", "--no-record"]) == 1
    assert capsys.readouterr().err == (
        "tpu-debug fit: remat=True and master_dtype are built into the looped step: drop loop=False\n")
    assert main(["fit", "tiny-llama", "--job", "decode", "--chunked-loss", "--no-record"]) == 1
    assert capsys.readouterr().err == (
        "tpu-debug fit: loop=True, remat=True and master_dtype shape a training step; job 'decode' has no backward\n")

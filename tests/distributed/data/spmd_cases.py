"""Single-process SPMD cases, run in a process of their own with 8 simulated CPU devices.

``python spmd_cases.py RESULTS.json LOGDIR`` (XLA_FLAGS must give 8 CPU devices):
trains a small Llama for two steps on PyTorch's CPU, on one `tpu` device and
sharded over a 2x4 mesh (data parallel, tensor parallel, both), each sharded
variant traced into a run of its own under LOGDIR, and checks a few eager and
compiled behaviours of sharded tensors. Everything measured goes to
RESULTS.json, which tests/distributed/test_spmd.py checks; nothing is judged here.
"""

from __future__ import annotations

import copy
import json
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from tpu_debug.runtime import distributed as dist

import tpu_debug

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from examples.distributed.train_llama_dp_tp import PLAN
from examples.models.tiny_llama import LlamaConfig, TinyLlama

CFG = LlamaConfig(vocab=64, hidden=32, intermediate=64, layers=1, heads=4, kv_heads=2, max_seq=16)
STEPS = 2
LR = 0.1


def _data() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, CFG.vocab, (4, 9), generator=g) for _ in range(STEPS)]


def _loss(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def _train(model, data, place_batch) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def train_step(tokens):
        loss = _loss(model, tokens)
        loss.backward()  # the compiled step's backward
        return loss.detach()

    step = tpu_debug.compile(train_step) if place_batch is not None else None
    losses = []
    for tokens in data:
        if step is None:  # PyTorch on CPU
            loss = _loss(model, tokens)
            loss.backward()
        else:
            loss = step(place_batch(tokens.to("tpu")))
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach().cpu()))
    return losses


def _weights(model) -> dict[str, list]:
    return {k: v.detach().cpu().tolist() for k, v in model.state_dict().items()}


def llama(results: dict, logdir: str) -> None:
    torch.manual_seed(0)
    reference = TinyLlama(CFG)
    data = _data()
    models = {name: copy.deepcopy(reference) for name in ("single", "dp", "tp", "dp_tp")}
    results["cpu"] = {"losses": _train(reference, data, None), "weights": _weights(reference)}
    single = models["single"].to("tpu")
    results["single"] = {"losses": _train(single, data, lambda t: t), "weights": _weights(single)}
    mesh = dist.init_device_mesh("tpu", (2, 4), mesh_dim_names=("dp", "tp"))
    for name, tp, dp in (("dp", False, True), ("tp", True, False), ("dp_tp", True, True)):
        model = models[name].to("tpu")
        if tp:
            dist.parallelize_module(model, mesh["tp"], PLAN)
        dist.distribute_module(model, mesh)
        batch = ("dp", None) if dp else (None, None)
        specs = {n: dist.sharding_spec(p) for n, p in model.named_parameters()}
        with tpu_debug.trace(logdir=logdir, name=name) as session:
            losses = _train(model, data, lambda t, b=batch: dist.mark_sharding(t, mesh, b))
        results[name] = {
            "losses": losses,
            "weights": _weights(model),
            "specs": {n: list(s) if s is not None else None for n, s in specs.items()},
            "run": str(session.run_dir),
        }


def eager_and_placement(results: dict, logdir: str) -> None:
    mesh = dist.init_device_mesh("tpu", (2, 4), mesh_dim_names=("dp", "tp"))
    x_cpu = torch.randn(8, 12)
    x = dist.mark_sharding(x_cpu.to("tpu"), mesh, ("dp", "tp"))
    out = {}
    # eager ops on a sharded tensor: shard by shard, or with a collective (a full sum)
    out["eager_sum"] = [float(x.sum().cpu()), float(x_cpu.sum())]
    out["eager_mul_row_sums"] = [(x * 2).sum(dim=1).cpu().tolist(), (x_cpu * 2).sum(dim=1).tolist()]
    out["local_shape"] = list(dist.local_shape(x))
    out["spec"] = list(dist.sharding_spec(x))
    # a parameter left on one device next to a sharded batch: replicated onto the mesh at the
    # first call, once (its payload is replaced)
    w_cpu = torch.randn(12, 3)
    w = w_cpu.to("tpu")
    f = tpu_debug.compile(lambda a, b: (a @ b).relu())
    with tpu_debug.trace(logdir=logdir, name="placement") as session:
        y = f(x, w)
        out["replicated_after_call"] = dist.is_sharded(w)
        out["matmul"] = [y.cpu().tolist(), (x_cpu @ w_cpu).relu().tolist()]
        # the same function with the batch laid out another way compiles again, and says why
        f(dist.mark_sharding(x_cpu.to("tpu"), mesh, (None, None)), w)
    out["run"] = str(session.run_dir)
    # annotations that do not fit are refused with the fix
    errors = {}
    for label, call in (
        ("length", lambda: dist.mark_sharding(torch.ones(8, 4).to("tpu"), mesh, ("dp",))),
        ("divide", lambda: dist.mark_sharding(torch.ones(6, 4).to("tpu"), mesh, ("tp", None))),
        ("name", lambda: dist.mark_sharding(torch.ones(8, 4).to("tpu"), mesh, ("batch", None))),
        ("twice", lambda: dist.mark_sharding(torch.ones(8, 8).to("tpu"), mesh, ("tp", "tp"))),
        ("view", lambda: dist.mark_sharding(torch.ones(8, 8).to("tpu")[:4], mesh, ("dp", None))),
        ("mesh", lambda: dist.init_device_mesh("tpu", (4, 4), mesh_dim_names=("a", "b"))),
    ):
        try:
            call()
            errors[label] = None
        except dist.ShardingError as exc:
            errors[label] = ["ShardingError", str(exc)]
        except dist.MeshError as exc:
            errors[label] = ["MeshError", str(exc)]
    out["errors"] = errors
    results["eager"] = out


def target(results: dict, logdir: str) -> None:
    """A data-parallel step recorded for the run's devices and for a TPU target of the same
    shape (v5e:2x4), by a CollectivesTracer given that target."""
    from tpu_debug.runtime import probes
    from tpu_debug.runtime.target import parse_target
    from tpu_debug.tracers.recording.collectives_tracer import CollectivesTracer
    from tpu_debug.tracing import active_trace

    mesh = dist.init_device_mesh("tpu", (8,), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    model = torch.nn.Linear(128, 256).to("tpu")
    dist.distribute_module(model, mesh)

    def train_step(x):
        loss = model(x).square().mean()
        loss.backward()
        return loss.detach()

    step = tpu_debug.compile(train_step)
    with tpu_debug.trace(logdir=logdir, name="target", hlo=False) as session:
        writer = active_trace()._writer  # the trace's own writer: the session only reads
        tracer = CollectivesTracer(writer, clock=lambda: 0.0, record_error=lambda w, m: None, hlo=False,
                                   target=parse_target("v5e:2x4"))
        probes.subscribe(tracer)
        try:
            step(dist.mark_sharding(torch.randn(64, 128).to("tpu"), mesh, ("dp", None)))
        finally:
            probes.unsubscribe(tracer)
            results["target_unfinished"] = tracer.close()
    results["target_run"] = str(session.run_dir)


def main() -> int:
    results_path, logdir = sys.argv[1], sys.argv[2]
    results: dict = {"devices": torch.tpu.device_count()}
    for case in (llama, eager_and_placement, target):
        try:
            case(results, logdir)
        except Exception:  # noqa: BLE001 - the test shows the traceback of the case that failed
            results.setdefault("failures", {})[case.__name__] = traceback.format_exc()
    Path(results_path).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

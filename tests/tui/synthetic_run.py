"""A deterministic run written with the run store's writer: what the TUI tests look at.

Eight steps of a loop whose batch length changes (8, 9, 10, 11, 12, 16, 16, 16):
``mul.Tensor`` recompiles at every new length (an eager recompile storm, with
key diffs), ``add.Tensor`` recompiles once for a baked-in Python scalar, the
compiled graph (identity ``main (train.py) forward``, programs ``g1/forward``
.. ``g3/forward``) recompiles on a failed dynamo guard; every step
copies its batch to the device (explicit), reads the loss with ``.item()`` and
tests it with ``bool()`` (implicit); ``nonzero`` falls back to CPU; five
divergence records, the first over tolerance on ``add.Tensor``; one graph
break. Each step is marked (``tpu_debug.step()``): step ``k`` spans [k, k + 1)
seconds; step 0 warms up, and steps 1-5 keep compiling ``mul.Tensor`` for new
lengths (steady-state recompiles). Source locations point at
``data/train.py``, which the run's ``cwd`` holds, so paths show as
``train.py:12``. Nothing depends on the clock.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from tpu_debug.core.records import FallbackInfo, TransferInfo
from tpu_debug.tracers import events as ev
from tpu_debug.tracers.hlo import make_program
from tpu_debug.tracers.recording.run_writer import RunWriter
from tpu_debug.tracers.store import DB_NAME

DATA = Path(__file__).resolve().parent / "data"
SOURCE = DATA / "train.py"
LENGTHS = (8, 9, 10, 11, 12, 16, 16, 16)
GRAPH = "main (train.py) forward"  # the identity of the compiled graph's compiles
# a name with console markup in it: it must show literally
ODD_OP = "custom[red]op[/red].default"

META = {
    "name": "synthetic",
    "tpu_debug_version": "0.1.0",
    "torch_version": "2.13.0",
    "jax_version": "0.10.2",
    "jaxlib_version": "0.10.2",
    "python_version": "3.11.7",
    "platform": "cpu",
    "device_kind": "cpu",
    "device_count": 1,
    "argv": ["train.py", "--steps", "8"],
    "command": ["python", "train.py", "--steps", "8"],
    "start_time": "2026-01-31T12:00:00.000+00:00",
    "options": {"hlo": True},
}
FINAL = {
    "status": "finished",
    "exit_status": 0,
    "error": None,
    "end_time": "2026-01-31T12:00:09.500+00:00",
    "duration": 9.5,
}


def _loc(line: int, function: str) -> ev.SourceLocation:
    return ev.SourceLocation(str(SOURCE), line, function)


def mul_hlo(n: int) -> tuple[str, str]:
    stablehlo = (
        "module @jit_mul attributes {mhlo.num_partitions = 1 : i32} {\n"
        f"  func.func public @main(%arg0: tensor<{n}x128xf32>, %arg1: tensor<f32>) -> tensor<{n}x128xf32> {{\n"
        f"    %0 = stablehlo.broadcast_in_dim %arg1, dims = [] : (tensor<f32>) -> tensor<{n}x128xf32>\n"
        f"    %1 = stablehlo.multiply %arg0, %0 : tensor<{n}x128xf32>\n"
        f"    return %1 : tensor<{n}x128xf32>\n"
        "  }\n"
        "}\n"
    )
    hlo = (
        f"HloModule jit_mul, is_scheduled=true, entry_computation_layout={{(f32[{n},128]{{1,0}}, f32[])->f32[{n},128]{{1,0}}}}\n"
        "\n"
        f"ENTRY %main.4 (Arg_0.1: f32[{n},128], Arg_1.2: f32[]) -> f32[{n},128] {{\n"
        f'  %Arg_0.1 = f32[{n},128]{{1,0}} parameter(0), metadata={{op_name="self"}}\n'
        f'  %Arg_1.2 = f32[] parameter(1), metadata={{op_name="other"}}\n'
        f"  %broadcast.3 = f32[{n},128]{{1,0}} broadcast(%Arg_1.2), dimensions={{}}, "
        'metadata={op_name="jit(mul)/aten::mul.Tensor/mul"}\n'
        f"  ROOT %multiply.4 = f32[{n},128]{{1,0}} multiply(%Arg_0.1, %broadcast.3), "
        'metadata={op_name="jit(mul)/aten::mul.Tensor/mul"}\n'
        "}\n"
    )
    return stablehlo, hlo


def add_hlo(n: int, scalar: str) -> tuple[str, str]:
    stablehlo = (
        "module @jit_add {\n"
        f"  func.func public @main(%arg0: tensor<{n}x128xf32>) -> tensor<{n}x128xf32> {{\n"
        f"    %cst = stablehlo.constant dense<{scalar}> : tensor<f32>\n"
        f"    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<{n}x128xf32>\n"
        f"    %1 = stablehlo.add %arg0, %0 : tensor<{n}x128xf32>\n"
        f"    return %1 : tensor<{n}x128xf32>\n"
        "  }\n"
        "}\n"
    )
    hlo = (
        "HloModule jit_add, is_scheduled=true\n"
        "\n"
        f"ENTRY %main.5 (Arg_0.1: f32[{n},128]) -> f32[{n},128] {{\n"
        f'  %Arg_0.1 = f32[{n},128]{{1,0}} parameter(0), metadata={{op_name="self"}}\n'
        f"  %constant.2 = f32[] constant({scalar})\n"
        f"  %broadcast.3 = f32[{n},128]{{1,0}} broadcast(%constant.2), dimensions={{}}, "
        'metadata={op_name="jit(add)/aten::add.Tensor/add"}\n'
        f"  ROOT %add.4 = f32[{n},128]{{1,0}} add(%Arg_0.1, %broadcast.3), "
        'metadata={op_name="jit(add)/aten::add.Tensor/add"}\n'
        "}\n"
    )
    return stablehlo, hlo


def graph_hlo(n: int) -> tuple[str, str]:
    stablehlo = (
        "module @jit_fn {\n"
        f"  func.func public @main(%arg0: tensor<{n}x128xf32>, %arg1: tensor<{n}x128xf32>) -> tensor<f32> {{\n"
        f"    %0 = stablehlo.multiply %arg0, %arg1 : tensor<{n}x128xf32>\n"
        f"    %1 = stablehlo.add %0, %arg1 : tensor<{n}x128xf32>\n"
        f"    %2 = stablehlo.reduce(%1 init: %cst) applies stablehlo.add across dimensions = [0, 1] : "
        f"(tensor<{n}x128xf32>, tensor<f32>) -> tensor<f32>\n"
        "    return %2 : tensor<f32>\n"
        "  }\n"
        "}\n"
    )
    hlo = (
        "HloModule jit_fn, is_scheduled=true\n"
        "\n"
        "%region_0.1 (reduce_sum.3: f32[], reduce_sum.4: f32[]) -> f32[] {\n"
        '  %reduce_sum.3 = f32[] parameter(0), metadata={op_name="reduce_sum"}\n'
        '  %reduce_sum.4 = f32[] parameter(1), metadata={op_name="reduce_sum"}\n'
        "  ROOT %reduce_sum.5 = f32[] add(%reduce_sum.3, %reduce_sum.4), "
        'metadata={op_name="jit(fn)/mean|aten::mean.default/reduce_sum"}\n'
        "}\n"
        "\n"
        f"%fused_computation (param_0.4: f32[{n},128], param_1.4: f32[{n},128]) -> f32[] {{\n"
        f"  %param_0.4 = f32[{n},128]{{1,0}} parameter(0)\n"
        f"  %param_1.4 = f32[{n},128]{{1,0}} parameter(1)\n"
        f"  %mul.0 = f32[{n},128]{{1,0}} multiply(%param_0.4, %param_1.4), "
        'metadata={op_name="jit(fn)/mul|aten::mul.Tensor/mul"}\n'
        f"  %add.0 = f32[{n},128]{{1,0}} add(%mul.0, %param_1.4), "
        'metadata={op_name="jit(fn)/add|aten::add.Tensor/add"}\n'
        "  %constant.0 = f32[] constant(0)\n"
        "  ROOT %reduce_sum.0 = f32[] reduce(%add.0, %constant.0), dimensions={0,1}, to_apply=%region_0.1, "
        'metadata={op_name="jit(fn)/mean|aten::mean.default/reduce_sum"}\n'
        "}\n"
        "\n"
        f"ENTRY %main.2 (arg0.1: f32[{n},128], arg1.1: f32[{n},128]) -> f32[] {{\n"
        f'  %arg0.1 = f32[{n},128]{{1,0}} parameter(0), metadata={{op_name="arg0"}}\n'
        f'  %arg1.1 = f32[{n},128]{{1,0}} parameter(1), metadata={{op_name="arg1"}}\n'
        "  ROOT %reduce_fusion = f32[] fusion(%arg0.1, %arg1.1), kind=kLoop, calls=%fused_computation, "
        'metadata={op_name="jit(fn)/mean|aten::mean.default/reduce_sum"}\n'
        "}\n"
    )
    return stablehlo, hlo


FX_NODES = (
    {"name": "mul", "target": "aten.mul.Tensor", "location": (str(SOURCE), 11, "step")},
    {"name": "add", "target": "aten.add.Tensor", "location": (str(SOURCE), 12, "step")},
    {"name": "mean", "target": "aten.mean.default", "location": (str(SOURCE), 13, "step")},
)


def _collectives(eid: int, program: str, graph: str) -> ev.CollectivesEvent:
    """The step graph sharded over 4 devices: an all-reduce of its gradient and an
    all-gather XLA combined from three (a tuple shape as wide as a narrow pane)."""
    combined = "(f32[1024,4096], f32[4096,4096], f32[4096,1024])"
    return ev.CollectivesEvent(
        eid, 7.9, "compiled", 1, _loc(13, "step"), graph, program, 4, "",
        (
            ev.Collective(
                "all-reduce", "all-reduce.1", "f32[128]", 512, 768, 4, 1, "{{0,1,2,3}}", "jit(fn)/sum",
                "mean", "aten::mean.default", file="train.py", line=13, function="step",
            ),
            ev.Collective(
                "all-gather", "all-gather.2", combined, 100663296, 75497472, 4, 1, "{{0,1,2,3}}",
                "jit(fn)/mul", "mul, add", "aten::mul.Tensor", asynchronous=True, file="train.py",
                line=11, function="step",
            ),
        ),
        argument_bytes=4 << 20, output_bytes=1 << 20, alias_bytes=0, temp_bytes=2 << 20, code_bytes=4096,
        seconds=0.05,
    )


def write_synthetic_run(run_dir: Path, *, close: bool = True, collectives: bool = True) -> tuple[Path, RunWriter]:
    """Write the run into ``run_dir`` (created); returns its run.db and the writer
    (already closed unless ``close=False``: then the run reads as still running).
    ``collectives=False`` leaves out the step graph's collectives, for a test that writes its own."""
    run_dir.mkdir(parents=True, exist_ok=True)
    db = run_dir / DB_NAME
    writer = RunWriter(db, {**META, "cwd": str(DATA)})
    nid = writer.new_id
    stats: list[tuple] = []
    written: list[ev.Event] = []

    def put(event: ev.Event) -> None:
        written.append(event)
        writer.put(event)

    mul_compiles: dict[int, tuple[int, str]] = {}  # length -> (event id, program hash)
    add_compiles: dict[str, tuple[int, str]] = {}
    graph_compiles: dict[int, tuple[int, str]] = {}
    last_mul: tuple[int, int] | None = None
    last_graph: tuple[int, int] | None = None
    for step, n in enumerate(LENGTHS):
        t = float(step)
        first = len(written)
        put(
            ev.TransferEvent(nid(), t + 0.05, None, 1, _loc(19, "main"), TransferInfo("h2d", n * 128 * 4, (n, 128), "float32", "copy", 2e-4), op="copy", implicit=False)
        )
        if n not in mul_compiles:
            program = writer.add_program(make_program("eager", "mul.Tensor", *mul_hlo(n)))
            args = (ev.ArgInfo("self", (n, 128), "float32"), ev.ArgInfo("other", static="2.0"))
            diffs: tuple[ev.KeyDiff, ...] = ()
            previous = None
            if last_mul is not None:
                previous = last_mul[0]
                diffs = (ev.KeyDiff("shape", f"f32[{last_mul[1]},128]", f"f32[{n},128]", arg_index=0, arg_name="self", dims=(0,)),)
            eid = nid()
            put(
                ev.CompileEvent(
                    eid,
                    t + 0.1,
                    "eager",
                    1,
                    _loc(11, "step"),
                    "mul.Tensor",
                    f"mul.Tensor(float32[{n},128], other=2.0)",
                    args,
                    0.040 + 0.001 * n,
                    program,
                    previous,
                    diffs,
                    identity="mul.Tensor",
                )
            )
            mul_compiles[n] = (eid, program)
            last_mul = (eid, n)
        scalar = "0.5" if step < 4 else "0.25"
        if scalar not in add_compiles:
            program = writer.add_program(make_program("eager", "add.Tensor", *add_hlo(8, scalar)))
            previous = add_compiles["0.5"][0] if add_compiles else None
            diffs = (ev.KeyDiff("scalar", "0.5", scalar, arg_index=1, arg_name="other"),) if previous else ()
            eid = nid()
            put(
                ev.CompileEvent(
                    eid,
                    t + 0.2,
                    "eager",
                    1,
                    _loc(12, "step"),
                    "add.Tensor",
                    f"add.Tensor(float32[8,128], other={scalar})",
                    (ev.ArgInfo("self", (8, 128), "float32"), ev.ArgInfo("other", static=scalar)),
                    0.030,
                    program,
                    previous,
                    diffs,
                    identity="add.Tensor",
                )
            )
            add_compiles[scalar] = (eid, program)
        if step < 3 and n not in graph_compiles:
            graph = f"g{len(graph_compiles) + 1}/forward"  # dynamo names each new graph
            program = writer.add_program(make_program("compiled", graph, *graph_hlo(n), FX_NODES))
            previous = last_graph[0] if last_graph else None
            diffs = (
                (
                    ev.KeyDiff("shape", str(last_graph[1]), str(n), arg_name="batch", dims=(0,), source="guard"),
                    ev.KeyDiff("guard", f"L['batch'].size()[0] == {last_graph[1]}", "failed", source="guard"),
                )
                if last_graph
                else ()
            )
            eid = nid()
            put(
                ev.CompileEvent(
                    eid,
                    t + 0.3,
                    "compiled",
                    1,
                    _loc(21, "main"),
                    graph,
                    f"{graph}(float32[{n},128], float32[{n},128])",
                    (ev.ArgInfo("arg0", (n, 128), "float32"), ev.ArgInfo("arg1", (n, 128), "float32")),
                    0.250,
                    program,
                    previous,
                    diffs,
                    identity=GRAPH,
                )
            )
            graph_compiles[n] = (eid, program, graph)
            last_graph = (eid, n)
        put(
            ev.TransferEvent(nid(), t + 0.8, None, 1, _loc(22, "main"), TransferInfo("d2h", 4, (), "float32", "item", 6e-5), op="item", implicit=True)
        )
        put(
            ev.TransferEvent(nid(), t + 0.85, None, 1, _loc(23, "main"), TransferInfo("d2h", 1, (), "bool", "bool", 5e-5), op="bool", implicit=True)
        )
        if step % 3 == 0:
            put(
                ev.FallbackEvent(nid(), t + 0.9, "eager", 1, _loc(25, "main"), FallbackInfo("nonzero", (ev.ArgInfo("self", (n, 128), "float32"),), 1e-3))
            )
            put(
                ev.TransferEvent(nid(), t + 0.9, None, 1, _loc(25, "main"), TransferInfo("d2h", n * 512, (n, 128), "float32", "fallback:nonzero", 1e-4), op="fallback:nonzero", implicit=True)
            )

        # the step, marked with tpu_debug.step() at its end: mul and add, and the graph
        scalar_now = "0.5" if step < 4 else "0.25"
        mine = written[first:]
        compiles = [e for e in mine if isinstance(e, ev.CompileEvent)]
        moved = [e for e in mine if isinstance(e, ev.TransferEvent)]
        put(
            ev.StepEvent(
                nid(),
                t,
                None,
                1,
                None,
                step,
                "explicit",
                t + 1.0,
                1.0,
                eager_ops=2,
                graph_runs=1,
                op_seconds=1.2e-4,
                compiles=len(compiles),
                recompiles=sum(1 for c in compiles if c.diffs),
                compile_seconds=sum(c.seconds for c in compiles),
                transfers=len(moved),
                transfer_bytes=sum(e.nbytes for e in moved),
                transfer_seconds=sum(e.seconds for e in moved),
                fallbacks=sum(1 for e in mine if isinstance(e, ev.FallbackEvent)),
                sequence=f"{zlib.crc32(f'mul {n} add {scalar_now} graph'.encode()):016x}",
                # the split: a quarter of each step waits for its batch, the reads wait on the device
                input_seconds=0.25,
                sync_seconds=sum(e.seconds for e in moved if e.direction == "d2h"),
                collective_seconds=0.0,
                checkpoint_seconds=0.0,
            )
        )

    put(
        ev.GraphBreakEvent(
            nid(),
            2.5,
            "compiled",
            1,
            _loc(22, "main"),
            "main",
            "call to Tensor.item() inside the compiled region",
        )
    )
    divergences = [
        ("mul.Tensor", "eager", "local", 1e-7, 1e-7, 0.5, 0, False, 1e-5, False, 11, "step", 1.15),
        ("add.Tensor", "eager", "local", 3.2e-3, 1.1e-3, 96.0, 12, False, 1e-5, True, 12, "step", 2.25),
        ("add.Tensor", "eager", "drift", 4.0e-3, 1.5e-3, 120.0, 40, False, 1e-5, False, 12, "step", 2.26),
        ("mean", "compiled", "drift", 5.0e-2, 2.0e-2, 1.0e3, 1, False, 1e-5, False, 13, "step", 2.4),
        ("mul", "compiled", "local", 2.0e-6, 1.0e-6, 2.0, 0, False, 1e-5, False, 11, "step", 2.35),
    ]
    # triage verdicts: the first op is wrong (in float64 too), the compiled drift is noise
    # through a relu's zero
    relu = ev.Crossing("relu", 1, 1024, "zero", "features.2", str(SOURCE), 13)
    triage = {
        ("add.Tensor", "local"): {"verdict": "wrong", "basis": "float64", "f64_max_abs": 3.2e-3, "f64_mismatched": 12},
        ("add.Tensor", "drift"): {"verdict": "wrong", "basis": "float64", "f64_max_abs": 3.2e-3, "f64_mismatched": 12},
        ("mean", "drift"): {"verdict": "noise", "basis": "upstream", "crossings": (relu,)},
    }
    for name, mode, measure, mabs, mrel, ulp, mism, nan, tol, first, line, fn, ts in divergences:
        compiled = mode == "compiled"
        put(
            ev.DivergenceEvent(
                nid(),
                ts,
                mode,
                1,
                _loc(line, fn),
                name,
                measure,
                mabs,
                mrel,
                ulp,
                mism,
                nan,
                tol,
                first,
                rtol=1.3e-6,
                atol=1e-5,
                ratio=mabs / tol,
                numel=1024,
                shape=(8, 128),
                dtype="float32",
                device_dtype="float32",
                graph="g3/forward" if compiled else None,
                target=f"aten.{name}.default" if compiled else "",
                **triage.get((name, measure), {}),
            )
        )

    if collectives:
        put(_collectives(nid(), *graph_compiles[10][1:]))

    # op_stats: executions per program
    counts: dict[int, int] = {}
    for n in LENGTHS:
        counts[n] = counts.get(n, 0) + 1
    sid = 1000
    for n, (eid, program) in mul_compiles.items():
        stats.append(
            (
                sid,
                "eager",
                "mul.Tensor",
                f"mul.Tensor(float32[{n},128], other=2.0)",
                program,
                counts[n],
                2e-5 * counts[n],
            )
        )
        sid += 1
    for scalar, (eid, program) in add_compiles.items():
        k = 4
        stats.append(
            (
                sid,
                "eager",
                "add.Tensor",
                f"add.Tensor(float32[8,128], other={scalar})",
                program,
                k,
                1.5e-5 * k,
            )
        )
        sid += 1
    for n, (eid, program, graph) in graph_compiles.items():
        k = 6 if n == 10 else 1
        stats.append(
            (sid, "compiled", graph, f"{graph}(float32[{n},128], float32[{n},128])", program, k, 8e-5 * k)
        )
        sid += 1
    stats.append((sid, "eager", ODD_OP, f"{ODD_OP}(float32[4])", None, 3, 3e-5))
    sent = []

    def source() -> list[tuple]:
        if sent:
            return []
        sent.append(True)
        return stats

    writer.set_stats_source(source)
    writer.flush()
    writer.set_stats_source(None)
    if close:
        writer.close(FINAL)
        assert writer.error is None, writer.error
    return db, writer


def peak_program(event_id: int, *, status: str = "hbm_oom") -> ev.ProgramMemoryEvent:
    """A compiled step's peak as the TPU compiler assigned it (what ``tracers.reading.peak_buffers``
    records): 20 GiB, refused on a v5e, its buffers adding up to that total."""
    gib, mib = 1 << 30, 1 << 20
    buffers = (
        ev.ProgramBuffer("activation", 8 * gib, 8 * gib, "f32", (64, 1024, 32768), "fusion.3", "fusion",
                         "mm_1|aten::mm.default", 3, 9, str(SOURCE), 12, "main"),
        ev.ProgramBuffer("temporary", 6 * gib, 6 * gib, "f32", (64, 1024, 24576), "fusion.7", "fusion",
                         "mul_2|aten::mul.Tensor", 5, 8, str(SOURCE), 16, "step"),
        ev.ProgramBuffer("parameter", 4 * gib, 4 * gib, "f32", (32768, 32768), "dyn_1_.1", "parameter",
                         "model.weight", 0, 10, note="made before the trace began"),
        ev.ProgramBuffer("optimizer_state", gib + 512 * mib, gib + 384 * mib, "f32", (16384, 24576), "dyn_3_.1",
                         "parameter", "exp_avg of model.weight", 0, 10, note="made before the trace began"),
        ev.ProgramBuffer("temporary", 512 * mib - 4096, 0, count=7),
        ev.ProgramBuffer("unused", 4096),
    )
    kinds = {}
    for b in buffers:
        kinds[b.kind] = kinds.get(b.kind, 0) + b.nbytes
    total = sum(kinds.values())
    return ev.ProgramMemoryEvent(
        event_id, 3.5, "compiled", 1, _loc(12, "main"), name="g3/forward", source="target", status=status,
        total_bytes=total, heap_bytes=14 * gib + 512 * mib, unused_bytes=4096, peak_position=7, length=11,
        peak_op="mul_2|aten::mul.Tensor", target="v5e", required_bytes=total, available_bytes=16 * gib - gib // 4,
        kinds=tuple(kinds), kind_bytes=tuple(kinds.values()), buffers=buffers,
        timeline_positions=tuple(range(11)),
        timeline_bytes=tuple(v * gib for v in (4, 5, 9, 13, 14, 18, 19, 20, 14, 12, 6)),
    )

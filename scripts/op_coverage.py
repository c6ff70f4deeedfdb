"""Generate docs/op_coverage.md: core aten ops on `tpu` and the OpInfo pass counts.

Usage::

    python scripts/op_coverage.py                  # rewrite docs/op_coverage.md
    python scripts/op_coverage.py --check          # exit 1 if docs/op_coverage.md is stale (CI)
    python scripts/op_coverage.py --sweep full     # run the full OpInfo sweep (-n 2), record
                                                   # its counts and wall time, rewrite the doc
    python scripts/op_coverage.py --results FILE   # record a finished sweep's results instead
    python scripts/op_coverage.py --module-results FILE   # record a ModuleInfo sweep's results

The doc is a function of committed inputs only, so ``--check`` is exact:

* every ``torch.Tag.core`` aten overload, marked *lowered* (a registered
  lowering, or for an in-place / out= overload its functional op's), *kernel*
  (a PrivateUse1 kernel in runtime/device.py: views, copies, allocation),
  *decomposed* (``torch._decomp.decomposition_table`` or a composite kernel
  PyTorch runs for every backend) or *missing*;
* the OpInfo pass counts per dtype, from op_db and
  tests/runtime/opinfo_expectations.py. The harness's xfails are strict, so in
  a green CI a case passes exactly when it has no entry;
* the last recorded sweep (docs/opinfo_sweep.json, written by ``--sweep`` or
  ``--results`` from the JSON lines the harness writes when
  ``TPU_DEBUG_OPINFO_RESULTS=path`` is set): measured counts per dtype and wall
  time;
* the last recorded ModuleInfo sweep per mode (docs/moduleinfo_sweep.json, written by
  ``--module-results`` from the JSON lines tests/runtime/test_moduleinfo.py writes when
  ``TPU_DEBUG_MODULEINFO_RESULTS=path`` is set), with the tolerance entries of
  tests/runtime/moduleinfo_expectations.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "op_coverage.md"
SWEEP = ROOT / "docs" / "opinfo_sweep.json"
MODULE_SWEEP = ROOT / "docs" / "moduleinfo_sweep.json"
HARNESS = ROOT / "tests" / "runtime"
TARGET_F32 = 93.0
TOP_MISSING = 30

CI_COMMAND = "python -m pytest tests/runtime/test_opinfo.py -n 2 -q"
FULL_COMMAND = "TPU_DEBUG_OPINFO_FULL=1 python -m pytest tests/runtime/test_opinfo.py -n 2 -q"


# ---- core aten ops -----------------------------------------------------------------


def core_ops() -> list:
    """Every aten overload tagged ``torch.Tag.core``, sorted by name."""
    import torch

    ops = []
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if torch.Tag.core in op.tags:
                ops.append(op)
    return sorted(ops, key=_op_name)


def _op_name(op) -> str:
    name = op._schema.name.split("::", 1)[1]
    return name if op._overloadname == "default" else f"{name}.{op._overloadname}"


def status(op) -> str:
    import torch
    from torch._decomp import decomposition_table
    from tpu_debug.runtime.eager import plan_for
    from tpu_debug.runtime.ops import lookup

    # an in-place / out= variant runs through its functional op's lowering
    if lookup(op) is not None or plan_for(op).lowering is not None:
        return "lowered"
    qualname = op._schema.name + ("" if op._overloadname == "default" else f".{op._overloadname}")
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if has(qualname, "PrivateUse1"):
        return "kernel"
    if op in decomposition_table or any(
        has(qualname, key) for key in ("CompositeImplicitAutograd", "CompositeExplicitAutograd",
                                       "CompositeExplicitAutogradNonFunctional")
    ):
        return "decomposed"
    return "missing"


# ---- OpInfo counts -------------------------------------------------------------------


def _harness():
    sys.path.insert(0, str(HARNESS))
    import opinfo_expectations as table
    import test_opinfo as harness

    return harness, table


def opinfo_counts(harness, table) -> dict:
    """Per mode and dtype: cases, passing in the CI tier and in the full sweep, xfail, skip."""
    counts: dict = defaultdict(Counter)
    for op, dtype, mode in harness.cases():
        d = harness.dtype_name(dtype)
        c = counts[(mode, d)]
        c["cases"] += 1
        ci = table.expectation(op.name, op.variant_test_name, d, mode, full=False)
        full = table.expectation(op.name, op.variant_test_name, d, mode, full=True)
        if full is None:
            c["pass_full"] += 1
        elif full[0] == "skip":
            c["skip"] += 1
        else:
            c["xfail_full" if ci is None else "xfail"] += 1
        if ci is None:
            c["pass_ci"] += 1
    names = [harness.dtype_name(t) for t in harness.DTYPES]
    return {
        mode: {d: dict(counts[(mode, d)]) for d in names if (mode, d) in counts} for mode in harness.MODES
    }


def error_counts(table) -> dict:
    """PyTorch's OpInfo error inputs that CPU refuses: per mode, how many, how many `tpu`
    refuses the same way (no xfail entry: the harness's xfails are strict), and the others
    with their reasons."""
    import test_opinfo_errors as errors

    cases = errors.cpu_refused()
    out = {}
    for mode in errors.MODES:
        failing = {}
        for name, index in cases:
            reason = table.ERROR_INPUTS.get((name, index, mode)) or table.ERROR_INPUTS.get((name, index, "*"))
            if reason is not None:
                failing[(name, index)] = reason
        out[mode] = {"cases": len(cases), "pass": len(cases) - len(failing), "failing": failing}
    return out


def _errors_lines(counts: dict) -> list[str]:
    eager, lazy = counts["eager"], counts["lazy"]
    out = [
        "## Errors (OpInfo error_inputs)",
        "",
        "`tests/runtime/test_opinfo_errors.py` runs PyTorch's OpInfo `error_inputs` (each op's",
        "calls it must refuse, with the exception type and a regular expression for the message)",
        "on CPU and on `tpu`. A call CPU refuses as the ErrorInput says is a case; `tpu` must raise",
        "the same type, with a message the expression matches, at the call (results are not read).",
        "Tensors sharing storage share it on `tpu` too; a tensor PyTorch puts on `meta` stays there.",
        "",
        "| mode | calls CPU refuses | refused the same way on `tpu` | not |",
        "|---|---:|---:|---:|",
        f"| eager | {eager['cases']} | {eager['pass']} | {len(eager['failing'])} |",
        f"| lazy (`DEFER_AND_FUSE`, `data_checks` on) | {lazy['cases']} | {lazy['pass']} | {len(lazy['failing'])} |",
        "",
        "Measured with the same harness before the lowerings carried PyTorch's checks: of the 691",
        "calls, 582 were refused the same way eagerly, 41 returned a value (indices out of range,",
        "invalid `multinomial` distributions, `uniform_(3, -1)`, a 2-D `bucketize` boundary, a",
        "negative convolution padding, `softshrink` with a negative lambda, `out=` tensors",
        "overlapping their inputs, ...) and 68 raised another error (convolution checks worded",
        "otherwise, dtype mismatches, meta kernels' wording, 65-dimensional inputs).",
        "",
        "What still differs, and why:",
        "",
        "| op | error inputs | reason |",
        "|---|---|---|",
    ]
    by_reason: dict = defaultdict(lambda: defaultdict(list))
    for (name, index), reason in eager["failing"].items():
        by_reason[reason][name].append(index)
    for reason, ops in by_reason.items():
        for name, indices in sorted(ops.items()):
            out.append(f"| `{name}` | {', '.join(map(str, sorted(indices)))} | {reason} |")
    out += [
        "",
        "### Checks that need the data: `config.data_checks`",
        "",
        "An index out of range (`gather`, `scatter`, `scatter_add`, `scatter_reduce`, `index_select`,",
        "`take`, `embedding`, `x[i]`, `index_put`, `index_add`, `index_copy`, `index_fill`), a class",
        "target out of range (`multi_margin_loss`, `multilabel_margin_loss`), a mask asking",
        "`masked_scatter` for more elements than its source has, and a `multinomial`",
        "distribution with a negative, `nan` or `inf` entry or a row summing to 0 raise on CPU. XLA",
        "computes them silently: a TPU clamps the index (another row is read or written) and samples",
        "from whatever the distribution is. Each op's lowering declares its check",
        "(`Lowering.values`, runtime/value_checks.py); where it runs depends on the mode:",
        "",
        "| mode | `data_checks` unset (default) | `data_checks` on |",
        "|---|---|---|",
        "| eager | checked before the op; raises CPU's error | the same |",
        "| lazy | not checked: the program is unchanged | checked at the op (the pending graph runs: a sync); raises |",
        "| compiled | not checked: the program is unchanged | checked in the program, read after it; raises |",
        "",
        "`data_checks` is a runtime option: `TPU_DEBUG_DATA_CHECKS=1`, TorchTPU's",
        "`TORCH_TPU_INTERNAL_ENABLE_DEBUG_CHECKS=1` (read when tpu_debug's variable is unset), or",
        "`tpu_debug.runtime.config.data_checks = True`; set to 0 it turns the eager checks off too.",
        "Eagerly the checked values are read on the host before the op. On the CPU backend a",
        "`gather` of a 64x64 tensor by 64x8 indices took 45 to 50 us of host CPU time per call",
        "checked and 17 to 24 unchecked (an `embedding` of 8x128 tokens: 52 against 24), measured",
        "at a load average of 16 on 2 cores, so the figures are rough: the read itself (a numpy",
        "view of the index, its min and max) is about half of it, the rest Python. An index still",
        "being computed makes the read wait for it, and on a TPU the read is a device-to-host copy.",
        "That is the price of PyTorch's error at the line that caused it; `data_checks=0` buys it",
        "back.",
        "",
        "Whatever the setting, a probe listening for `on_invalid_value` (runtime/probes.py) hears",
        "each failed check, raised or not, with the op, the offending value and its bounds: lazy",
        "and compiled programs then compute the checks in the same program and the runtime reads",
        "the small reports after the program ran, so an untraced run pays nothing.",
        "",
        "Argument checks that need no data (shapes, dtypes, Python scalars: a negative padding,",
        "`uniform_(3, -1)`, `mm` of float32 by int64) are `Lowering.check`s, made before every",
        "eager or lazy call with CPU's messages; compiled graphs get PyTorch's own checks from",
        "dynamo's fake tensors.",
        "",
    ]
    return out


def missing_ops(harness, table) -> list[tuple[str, int, list[str]]]:
    """(aten op, blocked cases, blocked OpInfos) from "needs a lowering" xfail reasons."""
    blocked: dict = defaultdict(set)
    for op, dtype, mode in harness.cases():
        d = harness.dtype_name(dtype)
        entry = table.expectation(op.name, op.variant_test_name, d, mode, full=True)
        if entry is None or entry[0] == "skip" or not entry[1].startswith("needs a lowering: "):
            continue
        blocked[entry[1].removeprefix("needs a lowering: ")].add((harness.op_id(op), d, mode))
    rows = [(op, len(cases), sorted({c[0] for c in cases})) for op, cases in blocked.items()]
    return sorted(rows, key=lambda r: (-r[1], r[0]))


# ---- sweep summary ------------------------------------------------------------------------


def summarize(results: Path, wall_seconds: float | None) -> dict:
    """Measured counts per mode and dtype from the harness's JSON lines: {mode: summary}."""
    rows = {}
    for line in results.read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            rows[(r["op"], r["variant"], r["dtype"], r["mode"])] = r
    import jax
    import torch

    out = {}
    for mode in sorted({r["mode"] for r in rows.values()}):
        by = defaultdict(Counter)
        tiers = set()
        for r in rows.values():
            if r["mode"] != mode:
                continue
            tiers.add(r["tier"])
            by[r["dtype"]][r["outcome"]] += 1
            if r["outcome"] == "passed" and r.get("graphs") == 0:
                by[r["dtype"]]["passed_without_graph"] += 1
        out[mode] = {
            "tier": "full" if "full" in tiers else "ci",
            "wall_seconds": None if wall_seconds is None else round(wall_seconds),
            "torch": torch.__version__,
            "jax": jax.__version__,
            "platform": jax.devices()[0].platform,
            "counts": {d: dict(sorted(c.items())) for d, c in sorted(by.items())},
        }
    return out


def _load_sweeps() -> dict:
    """docs/opinfo_sweep.json: {mode: summary} (an older flat file is the eager sweep)."""
    if not SWEEP.exists():
        return {}
    data = json.loads(SWEEP.read_text(encoding="utf-8"))
    if "counts" in data:  # before compiled mode: one eager summary, counts keyed "eager/dtype"
        data = dict(data, counts={k.split("/", 1)[1]: v for k, v in data["counts"].items()})
        return {"eager": data}
    return data


def run_sweep(tier: str) -> tuple[Path, float]:
    env = dict(os.environ)
    fd, path = tempfile.mkstemp(prefix="opinfo-", suffix=".jsonl")
    os.close(fd)
    env["TPU_DEBUG_OPINFO_RESULTS"] = path
    if tier == "full":
        env["TPU_DEBUG_OPINFO_FULL"] = "1"
    else:
        env.pop("TPU_DEBUG_OPINFO_FULL", None)
    cmd = [sys.executable, "-m", "pytest", "tests/runtime/test_opinfo.py", "-n", "2", "-q",
           "-p", "no:cacheprovider"]
    print(f"running {' '.join(cmd)} (results in {path})", file=sys.stderr)
    start = time.monotonic()
    subprocess.run(cmd, cwd=ROOT, env=env, check=False)
    return Path(path), time.monotonic() - start


# ---- ModuleInfo ----------------------------------------------------------------------------

MODULE_FULL_COMMAND = "TPU_DEBUG_OPINFO_FULL=1 python -m pytest tests/runtime/test_moduleinfo.py -n 2 -q"


def summarize_modules(results: Path, wall_seconds: float | None) -> dict:
    """Measured counts per mode from test_moduleinfo.py's JSON lines: {mode: summary}."""
    rows = {}
    for line in results.read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            rows[(r["module"], r["training"], r["mode"])] = r
    import jax
    import torch

    out = {}
    for mode in sorted({r["mode"] for r in rows.values()}):
        mine = [r for r in rows.values() if r["mode"] == mode]
        failing = {r["module"] for r in mine if r["failed_inputs"]}
        modules = {r["module"] for r in mine}
        out[mode] = {
            "tier": "full" if all(r["tier"] == "full" for r in mine) else "ci",
            "wall_seconds": None if wall_seconds is None else round(wall_seconds),
            "cpu_seconds": round(sum(r.get("cpu_seconds", 0.0) for r in mine)),
            "torch": torch.__version__, "jax": jax.__version__, "platform": jax.devices()[0].platform,
            "inputs": sum(r["inputs"] for r in mine),
            "inputs_passed": sum(r["inputs"] - r["failed_inputs"] for r in mine),
            "modules": len(modules), "modules_passed": len(modules - failing),
            "failures": [
                {"module": r["module"], "training": "train" if r["training"] else "eval",
                 "failed_inputs": r["failed_inputs"], "inputs": r["inputs"], "error": r["error"]}
                for r in sorted(mine, key=lambda r: (r["module"], not r["training"])) if r["failed_inputs"]
            ],
        }
        if mode == "compiled":  # modules dynamo ran eagerly in every case (no graph for the backend)
            graphs: dict = defaultdict(int)
            for r in mine:
                graphs[r["module"]] += r.get("graphs", 0)
            out[mode]["modules_without_graph"] = sorted(m for m, n in graphs.items() if n == 0)
    return out


def _load_module_sweeps() -> dict:
    return json.loads(MODULE_SWEEP.read_text(encoding="utf-8")) if MODULE_SWEEP.exists() else {}


def _module_expectations():
    sys.path.insert(0, str(HARNESS))
    import moduleinfo_expectations

    return moduleinfo_expectations


def _modules_section(sweeps: dict, expectations) -> list[str]:
    tolerances = expectations.TOLERANCES
    out = [
        "## Modules (ModuleInfo)",
        "",
        "`tests/runtime/test_moduleinfo.py` runs PyTorch's `module_db` (every `torch.nn` module",
        "with its constructor and forward inputs) on `tpu` against CPU, in float32, in training and",
        "in evaluation mode: the module built on CPU from a fixed seed and again for `tpu` with the",
        "same weights, the forward, then the backward of the outputs' sum; outputs, buffers",
        "(running statistics) and the gradients of every parameter and input must equal CPU's",
        "(float32 tolerances, or as close to a float64 CPU run as CPU is), and an error CPU",
        "raises must be raised. The CI tier runs each module's first input eagerly (and lazily",
        "and compiled for every sixth module); the full sweep every input in every mode.",
        "",
        "| mode | module inputs | pass | modules | pass | sweep wall time (`-n 2`) | sweep CPU time |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for mode in ("eager", "lazy", "compiled"):
        sw = sweeps.get(mode)
        if sw is None:
            out.append(f"| {mode} | not recorded | | | | | |")
            continue
        wall = sw.get("wall_seconds")
        wall_text = "not measured" if wall is None else f"{wall // 60} min {wall % 60:02d} s"
        out.append(f"| {mode} ({sw['tier']} tier) | {sw['inputs']} | {sw['inputs_passed']} | {sw['modules']} | "
                   f"{sw['modules_passed']} | {wall_text} | {sw['cpu_seconds']} s |")
    any_sweep = next(iter(sweeps.values()), None)
    if any_sweep is not None:
        out += ["", (f"Recorded with torch {any_sweep['torch']}, jax {any_sweep['jax']}, XLA platform "
                     f"`{any_sweep['platform']}`. The wall time is the machine's share; the CPU time is the "
                     "tests' own (XLA's compile threads included).")]
    failures = [(mode, f) for mode in ("eager", "lazy", "compiled") for f in sweeps.get(mode, {}).get("failures", ())]
    out += ["", "What does not pass:", ""]
    if failures:
        out += ["| module | mode | train/eval | inputs failing | first failure |", "|---|---|---|---:|---|"]
        for mode, f in failures:
            error = (f["error"] or "").replace("|", "\\|")
            out.append(f"| `{f['module']}` | {mode} | {f['training']} | {f['failed_inputs']} of {f['inputs']} | {error} |")
    else:
        out.append("every module input of every recorded sweep passes.")
    if expectations.EXPECTATIONS:
        out += ["", "Expected failures and skips (`tests/runtime/moduleinfo_expectations.py`):", "",
                "| module | train/eval | mode | kind | why |", "|---|---|---|---|---|"]
        for (name, training, mode), (kind, reason) in sorted(expectations.EXPECTATIONS.items()):
            out.append(f"| `{name}` | {training} | {mode} | {kind} | {reason} |")
    without = sweeps.get("compiled", {}).get("modules_without_graph")
    if without:
        out += ["", "Compiled, dynamo ran these modules without handing the backend a graph (each still",
                ("checked against CPU): " + ", ".join(f"`{m}`" for m in without) + ". The recurrent modules are"),
                "among them by dynamo's design (`torch._dynamo.config.allow_rnn` is off by default); with it",
                "on, PyTorch's decomposition of `aten::lstm`/`aten::gru` traces them into one graph",
                "(`tests/runtime/test_ops_recurrent.py`)."]
    if tolerances:
        out += ["", "Tolerances wider than float32's defaults (`tests/runtime/moduleinfo_expectations.py`):", "",
                "| module | rtol | atol | why |", "|---|---:|---:|---|"]
        for name, (rtol, atol, reason) in sorted(tolerances.items()):
            out.append(f"| `{name}` | {rtol:g} | {atol:g} | {reason} |")
    out += [
        "",
        "Beyond `module_db`'s inputs, in all three modes against CPU: `nn.LSTM` (no bias; bidirectional",
        "with `batch_first` and `proj_size`; packed sequences with an initial state) and `nn.GRU`",
        "(`tests/runtime/test_ops_recurrent.py`: outputs, final states, gradients of parameters and",
        "input; compiled also through dynamo's RNN tracing), and `torch.utils.checkpoint` around a",
        "layer with dropout, `use_reentrant` both ways (`tests/runtime/test_checkpoint_rng.py`: the",
        "recomputed forward draws the first forward's masks; without dropout, the checkpointed layer",
        "trains equal to CPU).",
        "",
        "Not covered by `module_db`'s inputs: `nn.TransformerEncoder` in evaluation mode without",
        "gradients and with a left-aligned `src_key_padding_mask` takes PyTorch's nested-tensor fast",
        "path; the `tpu` device has no nested tensors, so `aten::_nested_tensor_from_mask` raises",
        "`NoLoweringError` naming the fix (`enable_nested_tensor=False`). With gradients (training, or",
        "evaluation under autograd, as `module_db` runs it) the encoder declines that path and runs.",
        "",
        "```",
        f"{MODULE_FULL_COMMAND}    # full sweep: every input, every mode",
        "python scripts/op_coverage.py --module-results RESULTS.jsonl    # record a sweep here",
        "```",
        "",
    ]
    return out


# ---- the document --------------------------------------------------------------------------


def _counts_table(counts: dict) -> list[str]:
    out = [
        "| dtype | cases | pass (CI tier) | pass (full sweep) | pass % (full) | xfail | xfail beyond CI samples | skip |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for d, c in counts.items():
        pct = 100.0 * c.get("pass_full", 0) / c["cases"] if c["cases"] else 0.0
        out.append(
            f"| {d} | {c['cases']} | {c.get('pass_ci', 0)} | {c.get('pass_full', 0)} | {pct:.1f} % | "
            f"{c.get('xfail', 0)} | {c.get('xfail_full', 0)} | {c.get('skip', 0)} |"
        )
    return out


def _sweep_lines(mode: str, sweep: dict) -> list[str]:
    wall = sweep.get("wall_seconds")
    wall_text = "not measured" if wall is None else f"{wall // 60} min {wall % 60:02d} s"
    out = [
        f"Last recorded {mode} sweep: tier {sweep['tier']}; wall time {wall_text} (`-n 2`, 2 cores); "
        f"torch {sweep['torch']}, jax {sweep['jax']}, XLA platform `{sweep['platform']}`. What that run "
        "measured, before the expectations above were derived from it:",
        "",
    ]
    graphs = mode == "compiled"
    head = "| dtype | passed | failed (xfail or unexpected) |"
    out += [head + (" passed with no graph compiled |" if graphs else ""),
            "|---|---:|---:|" + ("---:|" if graphs else "")]
    for d, c in sweep["counts"].items():
        row = f"| {d} | {c.get('passed', 0)} | {c.get('failed', 0)} |"
        out.append(row + (f" {c.get('passed_without_graph', 0)} |" if graphs else ""))
    return out + [""]


def render(core: list[tuple[str, str]], counts: dict, missing: list, sweeps: dict, errors: dict,
           modules: list[str] | None = None) -> str:
    out = [
        "# Op coverage on `tpu`",
        "",
        "Generated by `python scripts/op_coverage.py`; do not edit by hand. CI runs",
        "`python scripts/op_coverage.py --check` (tests/test_op_coverage_doc.py), which fails",
        "when this file is stale.",
        "",
        "## OpInfo: PyTorch's op_db on `tpu` (eager)",
        "",
        "`tests/runtime/test_opinfo.py` runs every OpInfo's sample inputs on CPU and on `tpu` and",
        "compares results, mutated arguments (in-place, through a view, `out=`) and dtypes.",
        "Counts come from op_db and `tests/runtime/opinfo_expectations.py`: xfails are strict,",
        "so with CI green a case passes exactly when it has no entry.",
        "",
    ]
    out += _counts_table(counts["eager"])
    f32 = counts["eager"].get("float32")
    if f32:
        pct = 100.0 * f32.get("pass_full", 0) / f32["cases"]
        verdict = "meets" if pct >= TARGET_F32 else "is below"
        line = f"float32: {pct:.1f} % of op_db ops pass with no xfail entry; this {verdict} the "
        out += ["", line + f"{TARGET_F32:.0f} % target."]
    out += [""]
    if "eager" in sweeps:
        out += _sweep_lines("eager", sweeps["eager"])
    if "compiled" in counts:
        out += [
            "## OpInfo through `torch.compile(backend=\"tpu_debug\")` (compiled mode)",
            "",
            "The same checks with each call compiled: dynamo captures it, AOTAutograd",
            "functionalizes and decomposes it, and the graph runs as one XLA program. Run on",
            "float32 (the dtypes' math is the eager lowerings', checked above); the CI tier",
            "compiles the first sample of each op, the full sweep every sample.",
            "",
        ]
        out += _counts_table(counts["compiled"])
        out += [""]
        if sweeps.get("compiled", {}).get("tier") != "full":
            out += [
                "No full compiled sweep is recorded (about an hour on 2 cores): failures beyond",
                "each op's first sample are not known yet, so the full-sweep columns repeat the",
                "CI tier's.",
                "",
            ]
        if "compiled" in sweeps:
            out += _sweep_lines("compiled", sweeps["compiled"])
            out += [
                "*Passed with no graph compiled*: dynamo ran the call eagerly (a data-dependent",
                "output shape such as `nonzero`, a Python scalar result); the result is still checked.",
                "",
            ]
    out += [
        "Commands:",
        "",
        "```",
        f"{CI_COMMAND}    # CI tier: first samples of each (op, dtype, mode)",
        f"{FULL_COMMAND}    # full sweep: every sample",
        "python scripts/op_coverage.py --sweep full    # full sweep + record it here",
        "python tests/runtime/make_opinfo_expectations.py RESULTS.jsonl    # regenerate the xfails",
        "```",
        "",
    ]
    out += modules or []
    out += _errors_lines(errors)
    out += [
        f"## Missing lowerings blocking the most OpInfo cases (top {TOP_MISSING})",
        "",
        "From xfail reasons \"needs a lowering: aten::...\" (the first missing op a case meets).",
        "",
        "| aten op | blocked cases | OpInfos |",
        "|---|---:|---|",
    ]
    for op, n, names in missing[:TOP_MISSING]:
        shown = ", ".join(f"`{x}`" for x in names[:6]) + (f" (+{len(names) - 6})" if len(names) > 6 else "")
        out.append(f"| `{op}` | {n} | {shown} |")
    tally = Counter(s for _, s in core)
    out += [
        "",
        "## Core aten ops (`torch.Tag.core`)",
        "",
        "*lowered*: a registered lowering (runtime/ops); *kernel*: a PrivateUse1 kernel in",
        "runtime/device.py (views, copies, allocation); *decomposed*: runs through a PyTorch",
        "decomposition or composite kernel; *missing*: raises NotImplementedError on `tpu`.",
        "",
        f"{len(core)} overloads: " + ", ".join(f"{tally[s]} {s}" for s in ("lowered", "kernel", "decomposed", "missing")) + ".",
        "",
        "| op | status |",
        "|---|---|",
    ]
    out += [f"| `{name}` | {s} |" for name, s in core]
    return "\n".join(out) + "\n"


def generate() -> str:
    import tpu_debug  # noqa: F401 - registers the device and loads the lowerings

    harness, table = _harness()
    core = [(_op_name(op), status(op)) for op in core_ops()]
    modules = _modules_section(_load_module_sweeps(), _module_expectations())
    return render(core, opinfo_counts(harness, table), missing_ops(harness, table), _load_sweeps(),
                  error_counts(table), modules)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Generate docs/op_coverage.md.")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="exit 1 if docs/op_coverage.md is stale")
    group.add_argument("--sweep", choices=("ci", "full"), help="run the OpInfo harness and record it")
    group.add_argument("--results", type=Path, help="record a finished sweep's JSON lines")
    group.add_argument("--module-results", type=Path, nargs="+",
                       help="record finished ModuleInfo sweeps' JSON lines (a mode's newest replaces its old one)")
    parser.add_argument("--wall-time", type=float, nargs="+",
                        help="with --results or --module-results: each sweep's wall time, seconds")
    args = parser.parse_args(argv)

    if args.module_results:
        walls = args.wall_time or [None] * len(args.module_results)
        summary = _load_module_sweeps()
        for path, wall in zip(args.module_results, walls, strict=True):
            summary.update(summarize_modules(path, wall))
        MODULE_SWEEP.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {MODULE_SWEEP.relative_to(ROOT)}", file=sys.stderr)

    if args.sweep or args.results:
        results, wall = (run_sweep(args.sweep) if args.sweep else (args.results, (args.wall_time or [None])[0]))
        summary = {**_load_sweeps(), **summarize(results, wall)}  # a mode's newest sweep replaces its old one
        SWEEP.parent.mkdir(parents=True, exist_ok=True)
        SWEEP.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {SWEEP.relative_to(ROOT)} (results: {results})", file=sys.stderr)

    text = generate()
    if args.check:
        current = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
        if current != text:
            print(f"{DOC.relative_to(ROOT)} is stale; run: python scripts/op_coverage.py", file=sys.stderr)
            return 1
        print(f"{DOC.relative_to(ROOT)} is up to date", file=sys.stderr)
        return 0
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

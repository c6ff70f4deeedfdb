"""Rewrite the tables in opinfo_expectations.py from an OpInfo sweep's results.

Usage::

    TPU_DEBUG_OPINFO_FULL=1 TPU_DEBUG_OPINFO_RESULTS=opinfo.jsonl \\
        python -m pytest tests/runtime/test_opinfo.py -n 2 -q
    python tests/runtime/make_opinfo_expectations.py opinfo.jsonl

Every failing case becomes an xfail whose reason is the first line of its
error, tidied ("needs a lowering: aten::foo.bar" for a missing lowering). A
failure that shows only beyond the CI tier's first samples becomes
"xfail_full" (only a full sweep can tell). A float32 value mismatch within
rtol 1e-4 / atol 1e-5 becomes a TOLERANCES widening instead, with the
measured error as its reason. Skips are hand-written and always kept; xfails
of cases the sweep did not run are kept too. Only the two dict literals are
rewritten: the rest of the file is left as it is. A "flaky" or "flaky_full" entry
(a case whose CPU reference is not reproducible in every process) stays so: a failure
updates its reason, a pass keeps it as it was.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
TABLE = HERE / "opinfo_expectations.py"

WIDE_RTOL, WIDE_ATOL = 1e-4, 1e-5
_MAX_REASON = 150

_MISSING = re.compile(r"^(?:[\w=\- ]+: )?NotImplementedError: (aten::\S+) has no tpu lowering or decomposition")
# compiled mode: a graph node without a lowering
_MISSING_IN_GRAPH = re.compile(r"^(?:[\w=\- ]+: )?UnsupportedGraphOp: graph \S+ \(\w+\) node \S+: (aten::\S+) has no tpu lowering")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_REL = re.compile(r"max rel diff ([^,\s]+)")
_ABS = re.compile(r"max abs diff ([^,\s]+)")


def reason_for(error: str) -> str:
    """One concrete line from a test's first error line."""
    m = _MISSING.match(error) or _MISSING_IN_GRAPH.match(error)
    if m:
        return f"needs a lowering: {m.group(1)}"
    reason = _ADDRESS.sub("0x...", error.strip())
    reason = reason.replace('"', "'")
    if len(reason) > _MAX_REASON:
        reason = reason[: _MAX_REASON - 3].rstrip() + "..."
    return reason


def missing_op(reason: str) -> str | None:
    """The aten op a "needs a lowering" reason names."""
    return reason.removeprefix("needs a lowering: ") if reason.startswith("needs a lowering: ") else None


def _widening(row) -> tuple[float, float, str] | None:
    """A float32 value mismatch small enough to be XLA's float32 math, as a TOLERANCES entry."""
    if row["dtype"] != "float32" or "values differ from CPU" not in (row["error"] or ""):
        return None
    rel, abs_ = _REL.search(row["error"]), _ABS.search(row["error"])
    if rel is None or abs_ is None:
        return None
    rel_v, abs_v = float(rel.group(1)), float(abs_.group(1))
    if rel_v <= WIDE_RTOL or abs_v <= WIDE_ATOL:
        why = f"XLA's float32 arithmetic differs from PyTorch CPU's (max rel diff {rel_v:.1e}, "
        return WIDE_RTOL, WIDE_ATOL, why + f"max abs diff {abs_v:.1e})"
    return None


def _seen_by_ci(row, ci_samples) -> bool:
    """Whether the CI tier runs the check that failed (its first samples; views on the first)."""
    first = row["failed_sample"] or 0
    if row.get("failed_check") == "in-place through a view":
        return first == 0
    return first < ci_samples(row["mode"], row["dtype"])


def _lookup(table, key):
    name, variant, dtype, mode = key
    for k in ((name, variant, dtype, mode), (name, variant, dtype, "*"), (name, variant, "*", mode),
              (name, variant, "*", "*")):
        if k in table:
            return table[k]
    return None


def load_rows(path: Path) -> list[dict]:
    rows = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            rows[(row["op"], row["variant"], row["dtype"], row["mode"])] = row  # the last run wins
    return list(rows.values())


def build(rows, old_expect, old_tol, ci_samples):
    expect: dict = {}
    tol: dict = dict(old_tol)
    ran = {(r["op"], r["variant"], r["dtype"], r["mode"]) for r in rows}
    ran_ops = {(r["op"], r["variant"], r["mode"]) for r in rows}
    for key, (kind, reason) in old_expect.items():
        name, variant, dtype, mode = key
        if kind in ("skip", "flaky", "flaky_full"):  # hand-judged: a sweep's one outcome does not settle either
            expect[key] = (kind, reason)
        elif dtype == "*" or mode == "*":
            if (name, variant, mode) not in ran_ops and mode != "*":
                expect[key] = (kind, reason)
        elif key not in ran:
            expect[key] = (kind, reason)
    full_run = any(r["tier"] == "full" for r in rows)
    for r in rows:
        key = (r["op"], r["variant"], r["dtype"], r["mode"])
        if r["outcome"] != "failed":
            # a CI-tier run cannot see failures beyond its samples: keep those entries
            old = _lookup(old_expect, key)
            if not full_run and old is not None and old[0] == "xfail_full":
                expect[key] = old
            continue
        if any(k[:2] == key[:2] and k[3] in (key[3], "*") and k[2] in (key[2], "*")
               and v[0] == "skip" for k, v in expect.items()):
            continue
        wide = _widening(r)
        if wide is not None:  # within the widened tolerance (recorded now or by an earlier run)
            tol.setdefault(key[:3], wide)
            continue
        old_kind = (_lookup(old_expect, key) or ("",))[0]
        kind = "xfail_full" if full_run and not _seen_by_ci(r, ci_samples) else "xfail"
        if not full_run and old_kind == "xfail_full":
            kind = "xfail_full"
        if old_kind in ("flaky", "flaky_full"):
            kind = old_kind
        expect[key] = (kind, reason_for(r["error"] or "error"))
    return _collapse(expect, rows), tol


def _collapse(expect, rows):
    """One "*" entry for an op whose every dtype fails the same way."""
    dtypes_of = defaultdict(set)
    for r in rows:
        dtypes_of[(r["op"], r["variant"], r["mode"])].add(r["dtype"])
    groups = defaultdict(dict)
    for (name, variant, dtype, mode), entry in expect.items():
        groups[(name, variant, mode)][dtype] = entry
    out = {}
    for (name, variant, mode), by_dtype in groups.items():
        entries = set(by_dtype.values())
        all_dtypes = dtypes_of.get((name, variant, mode), set())
        if len(entries) == 1 and len(by_dtype) > 1 and set(by_dtype) == all_dtypes:
            out[(name, variant, "*", mode)] = entries.pop()
        else:
            for dtype, entry in by_dtype.items():
                out[(name, variant, dtype, mode)] = entry
    return out


def _render_dict(entries: dict, value_fmt) -> str:
    return "\n".join(f"    {_tuple(key)}: {value_fmt(entries[key])}," for key in sorted(entries))


def _tuple(values) -> str:
    return "(" + ", ".join(json.dumps(v) if isinstance(v, str) else repr(v) for v in values) + ")"


def _replace_dict(text: str, name: str, body: str) -> str:
    start = re.search(rf"^{name}: .*= \{{\n", text, re.MULTILINE)
    if start is None:
        raise SystemExit(f"{TABLE}: no '{name}: ... = {{' line to rewrite")
    end = text.index("\n}\n", start.end() - 1)
    return text[: start.end()] + (body + "\n" if body else "") + text[end + 1 :]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="JSON lines written via TPU_DEBUG_OPINFO_RESULTS")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import opinfo_expectations as table

    rows = load_rows(args.results)
    expect, tol = build(rows, table.EXPECTATIONS, table.TOLERANCES, table.ci_samples)
    text = TABLE.read_text(encoding="utf-8")
    text = _replace_dict(text, "EXPECTATIONS", _render_dict(expect, _tuple))
    text = _replace_dict(text, "TOLERANCES", _render_dict(tol, _tuple))
    TABLE.write_text(text, encoding="utf-8")
    kinds = defaultdict(int)
    for kind, _ in expect.values():
        kinds[kind] += 1
    print(f"{TABLE.name}: {dict(sorted(kinds.items()))}, {len(tol)} tolerance widenings "
          f"(from {len(rows)} results)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

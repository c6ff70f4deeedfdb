"""The advisor's rules for compile time: where the minutes of a compile go, when the cause is clear.

- ``unrolled_loop``: a Python loop over layers traced into one graph, each layer's lines
  compiled once per layer (the program holds every copy);
- ``compile_per_layer``: one function compiled again for each layer, every compile making a
  program an earlier one already made;
- ``compile_cache_miss``: the persistent compile cache holding nothing for programs an
  earlier run compiled, because of a flag, a version, its folder or the program's text;
- ``target_compile_bound``: the TPU target's compile of a program graph (compiled or lazy
  mode) taking most of the compile time, with the setting that cuts it. An eager op's
  target compile is short, and what eager mode compiles is already the runtime's own
  findings' subject (``eager_tiny_ops``).

They read the measured phases and the lines' shares of
:func:`~tpu_debug.tracers.reading.compile_time.compile_time` (``facts.compile_time``).
Compiles happen while a program warms up, so these rules, unlike the step rules, look at
the warm-up too: the time is paid at every start of the program, and on a TPU that is
minutes.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Sequence

from tpu_debug.core.format import format_seconds
from tpu_debug.tracers.advisor.facts import RunFacts
from tpu_debug.tracers.advisor.findings import Count, Evidence, Finding
from tpu_debug.tracers.advisor.prose import listing, most_common_line, plural, site_text
from tpu_debug.tracers.advisor.registry import rule
from tpu_debug.tracers.events import CompileEvent, CompileLinesEvent, LineCost, SourceLocation
from tpu_debug.tracers.reading.compile_time import CompileUnit
from tpu_debug.tracers.reading.recompile_analysis import read_guard

# a module class whose lines a graph traces in this many instances or more is a loop over
# layers (2 or 3 blocks side by side is a model's shape, not a loop worth a scan)
UNROLLED_INSTANCES = 6
# ... when those copies are at least this share of the program's operations
UNROLLED_SHARE = 0.5
# a function compiled this many times over, each making a program an earlier compile made
REPEATED_COMPILES = 3
# misses of the persistent cache explained by an earlier run's entry, at least
CACHE_MISSES = 3
# the TPU target's compile of the run's graphs: this share of the run's compile time, this
# many times their local XLA compile, and this many seconds at least (a compile of seconds is
# not where a TPU user's minutes go)
TARGET_SHARE = 0.5
TARGET_OVER_LOCAL = 3.0
TARGET_SECONDS = 10.0


def _compiles(facts: RunFacts) -> dict[int, CompileEvent]:
    return {c.id: c for c in facts.compiles}


def _lines_of(facts: RunFacts) -> dict[int, tuple[LineCost, ...]]:
    query = facts.query
    if not query.records(CompileLinesEvent.kind):
        return {}
    return {e.compile_event: e.lines for e in query.events(CompileLinesEvent.kind) if isinstance(e, CompileLinesEvent)}


def _line_key(x: LineCost) -> tuple:
    return (x.file, x.line, x.function)


def _span(lines: Sequence[int]) -> str:
    lines = sorted(set(lines))
    if not lines:
        return "-"
    return f"line {lines[0]}" if len(lines) == 1 else f"lines {lines[0]}-{lines[-1]}"


# -- a loop over layers unrolled into one graph -------------------------------------------------


@dataclasses.dataclass
class _Unrolled:
    module: str
    instances: int
    programs: list[str] = dataclasses.field(default_factory=list)
    lines: dict[tuple, LineCost] = dataclasses.field(default_factory=dict)
    callers: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    shares: list[float] = dataclasses.field(default_factory=list)
    ops: int = 0


@rule("unrolled_loop", about="a Python loop over layers traced into one compiled graph, one copy per layer",
      view="recompiles")
def unrolled_loop(facts: RunFacts) -> Iterable[Finding]:
    compiles = _compiles(facts)
    found: dict[str, _Unrolled] = {}
    for event_id, lines in _lines_of(facts).items():
        c = compiles.get(event_id)
        if c is None or c.mode != "compiled":
            continue
        total = sum(x.hlo_before for x in lines)
        nodes = sum(x.nodes for x in lines)
        by_module: dict[str, list[LineCost]] = collections.defaultdict(list)
        for x in lines:
            if x.module is not None and x.instances >= UNROLLED_INSTANCES and x.file is not None:
                by_module[x.module].append(x)
        for module, mine in by_module.items():
            # StableHLO operations where counted; else the graph's nodes
            share = (sum(x.hlo_before for x in mine) / total if total else
                     sum(x.nodes for x in mine) / nodes if nodes else 0.0)
            if share < UNROLLED_SHARE:
                continue
            u = found.setdefault(module, _Unrolled(module, 0))
            u.instances = max(u.instances, max(x.instances for x in mine))
            u.programs.append(c.name)
            u.shares.append(share)
            u.ops += sum(x.hlo_before for x in mine)
            for x in mine:
                u.lines.setdefault(_line_key(x), x)
                if x.caller_file is not None:
                    u.callers[SourceLocation(x.caller_file, x.caller_line or 0, x.caller_function or "")] += x.nodes
    times = {(t.file, t.line, t.function): t.seconds for t in facts.compile_time.lines}
    for module, u in sorted(found.items()):
        seconds = sum(times.get(k, 0.0) for k in u.lines)
        saved = seconds * (u.instances - 1) / u.instances
        loop = u.callers.most_common(1)[0][0] if u.callers else None
        first = min(u.lines.values(), key=lambda x: (x.file or "", x.line or 0))
        layer = SourceLocation(first.file or "", first.line or 0, first.function or "")
        numbers = [k[1] for k in u.lines if k[0] == first.file and k[1] is not None]
        where = f"{module}.{first.function}" if first.function else module
        share = max(u.shares)
        yield Finding(
            kind="unrolled_loop",
            severity="warning",
            title=(f"a loop over {u.instances} {module} layers is unrolled into {listing(sorted(set(u.programs)), 3)}: "
                   f"{where} ({_span(numbers)}) traced {u.instances} times, {share:.0%} of the program and about "
                   f"{format_seconds(seconds)} of compile"),
            fix=(f"compile one {module} and reuse it: {'the loop at ' + site_text(loop) if loop else 'the loop'} traces "
                 f"each of the {u.instances} layers into the graph, so dynamo, AOTAutograd and XLA handle "
                 f"{u.instances} copies. Compile the layer instead of the whole model (`layer.compile(backend=\"tpu_debug\")` "
                 f"for each layer, or `tpu_debug.compile(layer)`) and keep the loop in Python: dynamo traces "
                 f"{module} once and every layer runs that one program with its own weights. Or write the loop as "
                 f"a scan over stacked weights (`torch._higher_order_ops.scan`), which compiles one layer's body"),
            cost_seconds=saved,
            estimated=True,
            evidence=Evidence(
                loop or layer,
                (Count("layers", u.instances), Count("share of the program", round(share, 3)),
                 Count("operations of the layers", u.ops), Count("compile time of the layers", seconds, "s")),
                (f"{where}: {_span(numbers)} of {first.file}, each traced in {u.instances} instances of {module}",
                 f"programs: {listing(sorted(set(u.programs)), 4)}",
                 ("compile time per line is an estimate: each compile's measured time shared by the lines' "
                  "StableHLO operations (graph nodes for dynamo's and AOTAutograd's part)")),
            ),
            cause="unrolled",
            subject=f"{module} at {site_text(loop or layer)}",
            targets=tuple(sorted(set(u.programs))),
        )


# -- one function compiled again for every layer ------------------------------------------------


def _program_of(c: CompileEvent) -> str | None:
    """What one compile made, the same across graphs: its program's content hash (None without
    HLO recording: two programs that differ only in a constant baked into them, a Python
    number's value, have the same signature and size, so nothing else tells them apart)."""
    return c.program


def _frame_number(compile_id: str | None) -> str | None:
    if not compile_id or "/" not in compile_id:
        return None
    return compile_id.rsplit("/", 1)[0]


@rule("compile_per_layer", view="recompiles",
      about="a function compiled again for every layer in one step, each compile making the same program")
def compile_per_layer(facts: RunFacts) -> Iterable[Finding]:
    by_frame: dict[str, dict[str, list[CompileEvent]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for c in facts.compiles:
        frame = _frame_number(c.frame)
        # compiles again in steady state are recompiles, the recompile rules' subject: a loop
        # over layers compiles its function while the program warms up
        if c.mode == "compiled" and frame is not None and facts.phase(c.ts) != "steady":
            by_frame[frame][c.frame].append(c)
    units = facts.compile_time.units
    for frame, ids in sorted(by_frame.items()):
        order = sorted(ids, key=lambda cid: int(cid.rsplit("/", 1)[1]) if cid.rsplit("/", 1)[1].isdigit() else 0)
        seen: set[frozenset] = set()
        repeated: list[str] = []
        if any(_program_of(c) is None for cid in order for c in ids[cid]):
            continue  # programs not recorded: no telling a repeat from a new constant
        for cid in order:
            made = frozenset(_program_of(c) for c in ids[cid])
            if made in seen:
                repeated.append(cid)
            seen.add(made)
        # a loop over layers compiles them all in one step; one compile again at each step is
        # a recompile (a value that changes per call), the recompile rules' subject
        per_step = collections.Counter(facts.step_of(min(c.ts for c in ids[cid])) for cid in repeated)
        most = max(per_step.values(), default=0)
        if most < REPEATED_COMPILES or 2 * len(repeated) < len(order):
            continue
        mine = [u for u in units if u.compile_id in set(repeated)]
        cost = sum(u.phases.total for u in mine)
        frames = [u for u in units if u.kind == "frame" and u.compile_id in ids]
        function = frames[0].name if frames else ids[order[0]][0].name
        diffs = [read_guard(d) for cid in repeated for c in ids[cid] for d in c.diffs if d.source == "guard"]
        scalars = sorted({d.arg_name for d in diffs if d.aspect == "scalar" and d.arg_name})
        guards = sorted({d.before for d in diffs if d.aspect == "guard"})
        values = [d.now for d in diffs if d.aspect == "scalar" and d.now not in ("changed", None)]
        location = most_common_line(u.location for u in frames) or most_common_line(
            c.location for cid in order for c in ids[cid])
        if scalars:
            why = (f"dynamo compiled it for each value of the Python {'number' if len(scalars) == 1 else 'numbers'} "
                   f"{', '.join(repr(s) for s in scalars)} it is called with")
            fix = (f"pass what differs from layer to layer as something dynamo does not specialize on: the layer "
                   f"itself rather than its index ({', '.join(repr(s) for s in scalars)}: `step(layers[i], x)` with "
                   f"`step = tpu_debug.compile(lambda layer, x: layer(x))`), or a tensor for a number; one compile "
                   f"then serves every layer")
        elif guards:
            why = f"dynamo's guards failed at each call: {listing(guards, 2)}"
            fix = ("make what those guards test an input of the compiled function (the layer module itself, a "
                   "tensor) rather than a value or an object dynamo checks by identity; one compile then serves "
                   "every layer")
        else:
            why = "each call compiled it again"
            fix = ("compile the layer once and call that compiled function for every layer, passing the layer "
                   "(its weights) as an argument")
        yield Finding(
            kind="compile_per_layer",
            severity="warning",
            title=(f"{function} compiled {len(order)} times, {plural(len(repeated), 'compile')} making a program "
                   f"an earlier one already made ({format_seconds(cost)} of compile)"),
            fix=fix,
            cost_seconds=cost,
            evidence=Evidence(
                location,
                (Count("compiles", len(order)), Count("repeated", len(repeated)), Count("compile time", cost, "s")),
                (why, f"dynamo compiles {listing(order, 8)}", *(
                    [f"values: {listing(values, 8)}"] if values else [])),
            ),
            cause="scalar" if scalars else "guard" if guards else "other",
            subject=f"{function} at {site_text(location)}",
            targets=tuple(sorted({c.identity or c.name for cid in repeated for c in ids[cid]})),
        )


# -- a persistent compile cache that misses -----------------------------------------------------

_MISS_TITLES = {
    "flag": "other XLA flags than the run that wrote them",
    "version": "other versions than the run that wrote them",
    "path": "another cache folder than the run that wrote them",
    "program": "programs whose text changed since the run that wrote them",
}
_MISS_FIXES = {
    "flag": ("the cache key hashes XLA_FLAGS (and LIBTPU_INIT_ARGS) and the compile's options: a flag whose "
             "value changes from run to run (a path, a run id, a timestamp) makes every program new. Keep such "
             "values out of XLA_FLAGS, or set the flag the same way in every run; dump folders "
             "(--xla_dump_to) are left out of the key already"),
    "version": ("entries are kept per version of tpu_debug, jax, jaxlib and libtpu and per XLA platform: pin the "
                "versions (pip install -c constraints.txt) so runs share the cache; a build whose version changes "
                "at every install (a nightly, an editable build with a local version) compiles everything again"),
    "path": ("point every run at one cache folder kept between runs: TPU_DEBUG_COMPILE_CACHE_DIR (or TorchTPU's "
             "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT) set to a fixed path, not a folder made for each run "
             "(mktemp -d, a per-job name under /dev/shm)"),
    "program": ("something baked into the program changes from run to run (a Python number used as a constant, a "
                "value read from the clock or a random draw outside the graph): pass it as a tensor input so the "
                "program stays the same"),
}


@rule("compile_cache_miss", about="the persistent compile cache misses programs an earlier run compiled", view="recompiles")
def compile_cache_miss(facts: RunFacts) -> Iterable[Finding]:
    compiles = [c for c in facts.compiles if not c.from_cache]
    local = sum(c.xla_seconds for c in facts.compiles) + sum(c.read_seconds for c in facts.compiles)
    by_cause: dict[str, list[CompileEvent]] = collections.defaultdict(list)
    for c in compiles:
        if c.cache_miss in _MISS_FIXES:
            by_cause[c.cache_miss].append(c)
    for cause, missed in sorted(by_cause.items()):
        seconds = sum(c.xla_seconds for c in missed)
        if len(missed) < CACHE_MISSES or local <= 0 or seconds < 0.5 * local:
            continue
        details = collections.Counter(c.cache_miss_detail for c in missed if c.cache_miss_detail)
        read = sum(1 for c in facts.compiles if c.from_cache)
        yield Finding(
            kind="compile_cache_miss",
            severity="warning",
            title=(f"the compile cache missed {plural(len(missed), 'program')} an earlier run had compiled "
                   f"({format_seconds(seconds)} of XLA compile): {_MISS_TITLES[cause]}"),
            fix=_MISS_FIXES[cause],
            cost_seconds=seconds,
            evidence=Evidence(
                most_common_line(c.location for c in missed),
                (Count("missed", len(missed)), Count("read back", read), Count("compile time", seconds, "s")),
                tuple(d for d, _ in details.most_common(2)),
            ),
            cause=cause,
            subject=f"compile cache: {cause}",
            targets=tuple(sorted({c.identity or c.name for c in missed}))[:20],
        )


# -- a compile dominated by the TPU target's -----------------------------------------------------


@rule("target_compile_bound", about="the TPU target's compile of the run's graphs takes most of the compile time",
      view="recompiles")
def target_compile_bound(facts: RunFacts) -> Iterable[Finding]:
    ct = facts.compile_time
    graphs = ("compiled", "lazy")
    targets = [u for u in ct.units if u.kind == "target" and u.mode in graphs]
    target = sum(u.phases.total for u in targets)
    local = sum(u.phases.xla_compile for u in ct.units if u.kind == "program" and u.mode in graphs)
    if (not targets or local <= 0 or target < TARGET_SECONDS or target < TARGET_SHARE * ct.total
            or target < TARGET_OVER_LOCAL * local):
        return  # a dry run compiles only for the target: nothing local to compare with
    events = {e.id: e for e in facts.target_compiles}
    levels = {events[u.event].optimization_level for u in targets if u.event in events}
    largest: list[CompileUnit] = sorted(targets, key=lambda u: -u.phases.total)[:3]
    fixes = []
    causes = []
    if levels == {None}:
        causes.append("level")
        fixes.append("for a memory or fit check, compile at XLA's lowest effort: "
                     "TORCH_TPU_INTERNAL_XLA_OPTIONS=xla_optimization_level=O0 (TorchTPU's variable: on a TPU it sets "
                     "the TPU compile's level; here the target compile follows it too) compiles a large program "
                     "several times faster with nearly the same buffers, though its code and cost analysis are "
                     "not the default level's: leave it out of a speed run")
    if not causes:
        return  # nothing to change that is sure to cut it
    fixes.append("the target cache keeps each result (TPU_DEBUG_TARGET_CACHE): a second run of the same programs "
                 "reads them back")
    yield Finding(
        kind="target_compile_bound",
        severity="warning",
        title=(f"the TPU target's compile of {listing([u.name for u in largest], 3)} is {target / ct.total:.0%} of "
               f"the compile time ({format_seconds(target)}, {target / local:.1f}x XLA's compile for this machine)"),
        fix="; ".join(fixes),
        cost_seconds=target,
        evidence=Evidence(
            largest[0].location if largest else None,
            (Count("target compile", target, "s"), Count("local XLA compile", local, "s"),
             Count("target programs", len(targets))),
            tuple(f"{u.name}: {format_seconds(u.phases.total)} for the TPU" for u in largest),
        ),
        cause="+".join(causes),
        subject="target compile",
        targets=tuple(u.name for u in largest),
    )

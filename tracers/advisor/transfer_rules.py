"""The advisor's rules for what crosses between host and device inside the step: syncs nobody
asked for, CPU fallbacks, the same upload at every step, a copy to the host at every step.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from tpu_debug.core.format import format_bytes, format_seconds
from tpu_debug.tracers.advisor.causes import fold
from tpu_debug.tracers.advisor.facts import RunFacts
from tpu_debug.tracers.advisor.findings import Count, Evidence, Finding
from tpu_debug.tracers.advisor.prose import (
    REPEATS,
    every_step,
    index_span,
    listing,
    most_common_line,
    site_text,
    unstepped,
    where_text,
)
from tpu_debug.tracers.advisor.registry import rule
from tpu_debug.tracers.events import SourceLocation
from tpu_debug.tracers.reading.transfer_causes import (
    CAUSE_TEXT,
    USER_CAUSED,
    CallSite,
    CausedRead,
    advice_for,
    user_caused,
)

__all__ = ["UPLOAD_MIN_BYTES", "UPLOAD_SHARE"]

# a per-step upload of a new batch is worth overlapping when it is this big and takes
# this share of the steady step's time
UPLOAD_MIN_BYTES = 64 * 1024
UPLOAD_SHARE = 0.25



def _repeated(facts: RunFacts, events: Sequence[Any]) -> tuple[list[Any], list[int]] | None:
    """The events that make a per-step cost: those in steady steps when they come in (nearly)
    every steady step, or, in a run without steps, all of them when they repeat."""
    if unstepped(facts):
        return (list(events), []) if len(events) >= REPEATS else None
    steps = facts.steady_steps_of(events)
    if not every_step(facts, steps):
        return None
    return facts.in_steady(events), steps


def _how_often(facts: RunFacts, steps: list[int], events: Sequence[Any]) -> str:
    if steps:
        return f"in {len(steps)} of {len(facts.steady)} steady steps"
    return f"{len(events)} times (no steps were found; it repeats)"


def _every_nth(steps: Sequence[int]) -> int | None:
    """N when ``steps`` (sorted step indexes) are evenly spaced N >= 2 apart, else None."""
    gaps = {b - a for a, b in zip(steps, steps[1:])}
    return gaps.pop() if len(gaps) == 1 and min(gaps) >= 2 else None


@rule("implicit_sync", about="a sync nobody asked for (.item(), print, if t:) inside the step", view="transfers")
def implicit_sync(facts: RunFacts) -> Iterable[Finding]:
    yield from _one_per_switch(_implicit_syncs(facts))


def _one_per_switch(found: Iterable[tuple[Finding, CausedRead | None]]) -> list[Finding]:
    """Reads that one library switch makes at several lines of a file (torch.distributions'
    checks when a distribution is built and in its log_prob, both off with validate_args=False)
    are one cause: the finding stands at the switch's first check, the others are its
    consequences."""
    out: list[Finding] = []
    groups: dict[tuple[str, str], list[tuple[int, Finding]]] = {}
    for f, caused in found:
        loc = f.evidence.location
        if caused is None or caused.switch is None or loc is None:
            out.append(f)
        else:
            groups.setdefault((caused.switch, loc.file), []).append((USER_CAUSED.index(caused), f))
    for same in groups.values():
        same.sort(key=lambda p: (p[0], -p[1].cost_seconds))
        out.append(fold(same[0][1], [f for _, f in same[1:]]) if len(same) > 1 else same[0][1])
    return out


def _implicit_syncs(facts: RunFacts) -> Iterable[tuple[Finding, CausedRead | None]]:
    sites: dict[tuple, list[Any]] = {}
    for t in facts.transfers:
        if t.implicit and not t.op.startswith("fallback:"):
            sites.setdefault((t.location, t.op, t.direction), []).append(t)
    for (location, op, direction), events in sites.items():
        found = _repeated(facts, events)
        if found is None:
            continue
        chosen, steps = found
        if _every_nth(steps) is not None:
            # A read at a fixed cadence (``if step % N == 0: print(loss.item())``) is logging the
            # user chose, and it is the fix this rule gives. Each sync drains the device queue
            # once; at one sync per N steps the host loses its lead over the device on 1/N of
            # the steps, and how much that costs depends on the step's host/device balance,
            # which a read count does not show. Only a read at every step is certain to cost
            # at every step.
            continue
        seconds = sum(t.seconds for t in chosen)
        nbytes = sum(t.nbytes for t in chosen)
        site = CallSite(location, direction, op, True, len(chosen), nbytes, seconds, ())
        what = CAUSE_TEXT.get(op, op)
        library = _library_frame(chosen)
        caused = user_caused(library)
        title = f"{what} at {where_text(location)} waits for the device {_how_often(facts, steps, chosen)}"
        fix = advice_for(site)
        notes = (f"{direction} copies made by {what}",)
        if caused is not None:
            # the read is in library code, but the user's argument or cadence asks for it: the
            # line to change and the fix are the user's
            title = (f"{caused.what}: at {where_text(location)} it waits for the device "
                     f"{_how_often(facts, steps, chosen)}")
            fix = caused.fix
            notes += (f"library frame: {library}", f"caused by the call's {caused.cause}")
            library = None
        elif library is not None:
            # the sync is the library's own code (transformers' generate() checking its stopping
            # criteria, say): the user's line is what reached it, and the fix is not theirs to make
            title = (f"{what} inside library code ({library}), reached from {where_text(location)}, "
                     f"waits for the device {_how_often(facts, steps, chosen)}")
            fix = (f"the read is in {library}, not in this script: it syncs where the library needs "
                   "the value; call the library less often per step, or use an API of it that does not read")
            notes += (f"library frame: {library}",)
        yield Finding(
            kind="implicit_sync",
            severity="info" if library is not None else "warning",
            title=title,
            fix=fix,
            cost_seconds=seconds,
            evidence=Evidence(
                location,
                (
                    Count("syncs", len(chosen)),
                    Count("steady steps", len(steps)),
                    Count("bytes", nbytes, "B"),
                    Count("time", seconds, "s"),
                ),
                notes,
            ),
            steps=index_span(steps),
            cause="library" if library is not None else (caused.cause if caused is not None else op),
            subject=f"{site_text(location)} ({op})",
        ), caused


def _library_frame(events: Sequence[Any]) -> str | None:
    """The library frame every one of ``events`` was made in (its ``context``), None when any
    was the user's own line (a run recorded before contexts were kept has none)."""
    frames = {getattr(e, "context", None) for e in events}
    if len(frames) != 1 or None in frames:
        return None
    return frames.pop()


@rule("cpu_fallback", about="an op with no tpu lowering that runs on CPU inside the step", view="ops")
def cpu_fallback(facts: RunFacts) -> Iterable[Finding]:
    by_op: dict[str, list[Any]] = {}
    for f in facts.fallbacks:
        by_op.setdefault(f.name, []).append(f)
    moved = collections.defaultdict(list)
    for t in facts.transfers:
        if t.op.startswith("fallback:"):
            moved[t.op.removeprefix("fallback:")].append(t)
    for name, events in by_op.items():
        # unlike a sync every N steps (a fine way to log), a fallback in steady state at all
        # is one the step keeps paying: two steady steps with it are enough
        if unstepped(facts):
            if len(events) < REPEATS:
                continue
            chosen, steps = list(events), []
        else:
            steps = facts.steady_steps_of(events)
            if len(steps) < 2:
                continue
            chosen = facts.in_steady(events)
        copies = facts.in_steady(moved[name]) if steps else moved[name]
        seconds = sum(f.seconds for f in chosen) + sum(t.seconds for t in copies)
        shapes = listing(list(dict.fromkeys(", ".join(a.render() for a in f.args) for f in chosen)), 3)
        yield Finding(
            kind="cpu_fallback",
            severity="warning",
            title=f"{name} has no tpu lowering and runs on CPU {_how_often(facts, steps, chosen)}",
            fix=(
                f"give {name} a tpu lowering (runtime/ops/, @lower), or compute it with ops that have "
                "one: each call copies its inputs to the host and its result back"
            ),
            cost_seconds=seconds,
            evidence=Evidence(
                most_common_line(f.location for f in chosen),
                (
                    Count("calls", len(chosen)),
                    Count("host copies", len(copies)),
                    Count("bytes copied", sum(t.nbytes for t in copies), "B"),
                    Count("time", seconds, "s"),
                ),
                (f"inputs: {shapes}",),
            ),
            steps=index_span(steps),
            cause=name,
            subject=name,
            targets=(name,),
        )


def _payload(events: Sequence[Any]) -> str:
    """``"same"`` when every copy carried the same bytes, ``"new"`` when the bytes changed,
    ``"unknown"`` when a copy has no fingerprint (the runtime takes none of a large payload,
    so a batch is never taken for a constant)."""
    digests = {getattr(t, "digest", None) for t in events}
    if None in digests:
        return "unknown"
    return "same" if len(digests) == 1 else "new"


# factories whose result is a random draw (the others make the same values from the same arguments)
_RANDOM = frozenset({
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal", "bernoulli",
    "multinomial", "poisson", "uniform", "choice", "permutation", "random", "integers", "standard_normal",
})
# factory -> its _like form's arguments beside the tensor it takes the shape of
_LIKE = {"rand": "x", "randn": "x", "randint": "x, low, high", "ones": "x", "zeros": "x", "full": "x, value"}


@dataclasses.dataclass(frozen=True, slots=True)
class _Upload:
    """One line's uploads in steady state, as the h2d rule weighs them."""

    op: str
    location: SourceLocation | None
    aval: str
    per_step: float  # bytes
    seconds: float  # the copies' measured time, on this machine
    steps: tuple[int, ...]
    payload: str  # "same", "new" or "unknown" (see _payload)
    origin: str | None  # the host factory that made the data in the step, when the line shows one
    follows: str | None = None  # the device tensor whose shape or device the code reads for it
    module: str | None = None  # the nn.Module class whose method makes it
    made_line: int | None = None  # the line that made it, when not the upload's

    @property
    def made_at(self) -> SourceLocation | None:
        """The user's line that made the data: the upload's, or the one its name was made on."""
        if self.location is None or self.made_line is None:
            return self.location
        return dataclasses.replace(self.location, line=self.made_line)


def _on_tpu(facts: RunFacts, nbytes: float, steps: Sequence[int]) -> tuple[float, float] | None:
    """(the copies' time, the steps' time) on the run's TPU target, estimated: ``nbytes`` over
    its host link, and the steps' programs as its compiles estimate them; None without a
    target, or when a step has no estimate."""
    target = facts.target
    if target is None or not target.host_bandwidth_per_device:
        return None
    step_seconds = [facts.target_seconds.get(i) for i in steps]
    if not steps or any(t is None for t in step_seconds):
        return None
    return nbytes / target.host_bandwidth_per_device, sum(step_seconds)  # type: ignore[arg-type]


def _host_made_text(u: _Upload, facts: RunFacts) -> tuple[str, str]:
    made = u.origin or "a factory"
    name = made.rpartition(".")[2]
    inside = f" inside {u.module}" if u.module else ""
    copied = f" at line {u.location.line}" if u.made_line is not None and u.location is not None else ""
    title = (
        f"{made}(...) at {where_text(u.made_at)}{inside} {'draws' if name in _RANDOM else 'makes'} {u.aval} on the "
        f"host, copied to the device{copied} in {len(u.steps)} of {len(facts.steady)} steady steps"
    )
    x = u.follows or "x"
    if made.startswith("torch."):
        shaped = f" for a tensor shaped like {x}" if u.follows is None else ""
        like = f", or torch.{name}_like({_LIKE[name].replace('x', x, 1)}){shaped}" if name in _LIKE else ""
        instead = f"torch.{name}(..., device={x}.device){like}"
    else:
        instead = f"torch's own function (torch.rand, torch.randn, torch.randint, torch.arange) with device={x}.device"
    fix = (
        f"make it on the device, where it is used: {instead}; nothing is then made on the host or copied. "
        "The copy waits on the host at every step: on a TPU, whose step is far shorter than this "
        "machine's, that is a larger share of the step than here"
    )
    return title, fix


def _h2d_text(u: _Upload, facts: RunFacts, batches: bool) -> tuple[str, str] | None:
    """(title, fix) of a line that uploads at every steady step, or None when it is no finding.
    ``batches``: a line uploads data that changes and no factory made (a batch) in these steps."""
    n, steady = len(u.steps), len(facts.steady)
    what = CAUSE_TEXT.get(u.op, u.op)
    if u.payload == "same" and u.seconds > 0:
        # the same bytes every step: the copy buys nothing, whatever its share of the step
        title = (
            f"{what} at {where_text(u.location)} uploads the same {format_bytes(u.per_step)} ({u.aval}) to the device "
            f"in {n} of {steady} steady steps, {format_seconds(u.seconds / n)} per step"
        )
        fix = (
            "the data is identical at every step: create it once on the device before the loop "
            "(the same expression, hoisted above the loop) and reuse that tensor"
        )
        return title, fix
    if u.op == "tensor" and u.payload != "new":
        title = (
            f"torch.tensor(...) at {where_text(u.location)} builds a {u.aval} from Python data on the device "
            f"in {n} of {steady} steady steps"
        )
        fix = (
            "build it once, before the loop, when its values do not change; otherwise make it on the "
            "device (torch.arange, torch.full, indexing a tensor made once) instead of from a Python list"
        )
        return title, fix
    if u.origin is not None and (batches or u.follows is not None or u.module is not None):
        # data the step makes for its tensors (noise, timesteps, a mask): beside a batch, shaped
        # like or moved to a tensor already on the device, or made inside a model's method.
        # Whatever its size and share of this machine's step, it could be made on the device and
        # copy nothing. A step whose every upload is a factory's draw with sizes of its own is a
        # program's stand-in for loading data: data, not judged.
        return _host_made_text(u, facts)
    return _batch_text(u, facts, what)


def _batch_text(u: _Upload, facts: RunFacts, what: str) -> tuple[str, str] | None:
    """A new batch copied synchronously: a finding when it is large and takes UPLOAD_SHARE of
    the steps' time, on the run's TPU target when there is one (estimated), else on this machine."""
    if u.per_step < UPLOAD_MIN_BYTES:
        return None
    tpu = _on_tpu(facts, u.per_step * len(u.steps), u.steps)
    if tpu is not None:
        seconds, step_seconds = tpu
        where = f"of their time on a {facts.target} (estimated: its host link and the steps' programs compiled for it)"
    else:
        seconds, step_seconds = u.seconds, sum(s.seconds for s in facts.steady)
        where = "of their time on this machine (no TPU target: run with --target to weigh it on a TPU)"
    if step_seconds <= 0 or seconds < UPLOAD_SHARE * step_seconds:
        return None
    title = (
        f"{what} at {where_text(u.location)} copies {format_bytes(u.per_step)} ({u.aval}) to the "
        f"device in {len(u.steps)} steady steps, {100 * seconds / step_seconds:.0f}% {where}"
    )
    overlap = (
        "overlap the copy with the step: DataLoader(..., pin_memory=True) with "
        ".to('tpu', non_blocking=True), or prefetch the next batch while this one runs"
    )
    if u.payload == "new":  # the fingerprints differ: hoisting it out of the loop is no fix
        return title, f"the data changes at every step (a batch): {overlap}"
    return title, (
        "if the data is the same every step, move it to the device once, before the loop; "
        f"if it is a new batch, {overlap}"
    )


def _h2d_sites(facts: RunFacts) -> dict[tuple, list[Any]]:
    """The explicit uploads of steady steps by (line, op, shape, dtype), of the lines that
    upload in every steady step."""
    sites: dict[tuple, list[Any]] = {}
    for t in facts.transfers:
        if t.direction == "h2d" and not t.implicit:
            sites.setdefault((t.location, t.op, t.shape, t.dtype), []).append(t)
    out = {}
    for key, events in sites.items():
        steady = facts.in_steady(events)
        steps = facts.steady_steps_of(steady)
        if len(steps) >= max(REPEATS, len(facts.steady) - 1) and sum(t.nbytes for t in steady):
            out[key] = steady
    return out


@rule("h2d_every_step", about="the same host-to-device copy at every step (identical data uploaded again, a tensor rebuilt from Python data, data made on the host that could be made on the device, a batch copied synchronously)", view="transfers")
def h2d_every_step(facts: RunFacts) -> Iterable[Finding]:
    if len(facts.steady) < REPEATS:
        return
    sites = _h2d_sites(facts)
    found: list[Finding] = []
    # a batch: data that changes, made by no factory the user's line shows (a dataset's slice)
    batches = any(all(getattr(t, "origin", None) is None for t in events) and _payload(events) != "same"
                  for events in sites.values())
    for (location, op, shape, dtype), steady in sites.items():
        steps = facts.steady_steps_of(steady)
        made = {(getattr(t, "origin", None), getattr(t, "follows", None), getattr(t, "module", None),
                 getattr(t, "made_line", None)) for t in steady}
        origin, follows, module, made_line = made.pop() if len(made) == 1 else (None, None, None, None)
        u = _Upload(op, location, f"{dtype}[{','.join(map(str, shape))}]", sum(t.nbytes for t in steady) / len(steps),
                    sum(t.seconds for t in steady), tuple(steps), _payload(steady), origin, follows, module, made_line)
        text = _h2d_text(u, facts, batches)
        if text is None:
            continue
        found.append(_h2d_finding(u, steady, text, facts))
    yield from _one_per_made_line(found)


def _one_per_made_line(found: list[Finding]) -> list[Finding]:
    """One host-made tensor uploaded at several lines (``noise.to(dev)`` here, a library's copy
    of it there) is one cause: the costliest upload is the finding, the others its consequences."""
    groups: dict[tuple, list[Finding]] = {}
    out: list[Finding] = []
    for f in found:
        loc = f.evidence.location
        if f.cause == "host_made" and loc is not None:
            groups.setdefault((loc.file, loc.line), []).append(f)
        else:
            out.append(f)
    for same in groups.values():
        same.sort(key=lambda f: -f.cost_seconds)
        out.append(fold(same[0], same[1:]) if len(same) > 1 else same[0])
    return out


def _h2d_finding(u: _Upload, steady: Sequence[Any], text: tuple[str, str], facts: RunFacts) -> Finding:
    same = u.payload == "same"
    host_made = u.origin is not None and not same
    facts_text = f"{u.aval} by {CAUSE_TEXT.get(u.op, u.op)}"
    if same:
        facts_text += f", identical bytes in all {len(steady)} steady copies"
    if host_made:
        facts_text += f", made on the host by {u.origin}"
        if u.follows:
            facts_text += f" for {u.follows} (its shape or device is read from it)"
        if u.module:
            facts_text += f" in a method of {u.module}"
    title, fix = text
    library = _library_frame(steady)
    if library is not None:
        # the library builds and uploads it (transformers making position ids, say): the fix
        # is not the user's to make, and the user's line is what reached it
        title = f"inside library code ({library}): {title}"
        fix = f"the copy is made in {library}, not in this script; {fix}"
        facts_text += f"; library frame: {library}"
    n = len(u.steps)
    counts = [
        Count("copies", len(steady)),
        Count("steady steps", n),
        Count("bytes per step", u.per_step, "B"),
        Count("time per step", u.seconds / n, "s"),
        Count("time", u.seconds, "s"),
    ]
    tpu = _on_tpu(facts, u.per_step * n, u.steps)
    if tpu is not None:
        counts.append(Count(f"copy time per step on {facts.target} (estimated)", tpu[0] / n, "s"))
        counts.append(Count(f"step time on {facts.target} (estimated)", tpu[1] / n, "s"))
    return Finding(
        kind="h2d_every_step",
        severity="info" if library is not None else "warning",
        title=title,
        fix=fix,
        cost_seconds=u.seconds,
        evidence=Evidence(u.made_at if host_made else u.location, tuple(counts),
                          (facts_text, *([f"copied at {site_text(u.location)}"] if host_made and u.made_line else []))),
        steps=index_span(u.steps),
        cause="same_data" if same else ("host_made" if host_made else u.op),
        subject=f"{site_text(u.location)} ({u.op})",
    )


@rule("d2h_every_step", about="a copy to the host at every step (.cpu(), .to('cpu')), which waits for the device each time", view="transfers")
def d2h_every_step(facts: RunFacts) -> Iterable[Finding]:
    sites: dict[tuple, list[Any]] = {}
    for t in facts.transfers:
        if t.direction == "d2h" and not t.implicit and not t.op.startswith("fallback:"):
            sites.setdefault((t.location, t.op), []).append(t)
    for (location, op), events in sites.items():
        found = _repeated(facts, events)
        if found is None:
            continue
        chosen, steps = found
        if _every_nth(steps) is not None:
            continue  # a copy every N steps is what this rule's fix asks for
        yield _d2h_finding(facts, location, op, chosen, steps)


def _d2h_finding(facts: RunFacts, location: SourceLocation | None, op: str, chosen: Sequence[Any],
                 steps: Sequence[int]) -> Finding:
    seconds = sum(t.seconds for t in chosen)
    nbytes = sum(t.nbytes for t in chosen)
    per = len(steps) or len(chosen)
    avals = listing(list(dict.fromkeys(f"{t.dtype}[{','.join(map(str, t.shape))}]" for t in chosen)), 3)
    what = CAUSE_TEXT.get(op, op)
    library = _library_frame(chosen)
    title = (
        f"{what} at {where_text(location)} copies {format_bytes(nbytes / per)} ({avals}) to the host "
        f"{_how_often(facts, steps, chosen)}: each copy waits for the device to finish the work queued before it"
    )
    fix = (
        "keep the work on the device: accumulate what the host reads in a device tensor (correct += "
        "(pred == y).sum(), total += loss.detach()) and copy it every N steps or once after the loop; "
        "a copy at every step makes the host wait for the device at every step, so it cannot queue the "
        "next step while the device runs this one"
    )
    notes = [f"{avals} by {what}, measured on this machine: {format_seconds(seconds)} in all"]
    if library is not None:
        title = f"inside library code ({library}): {title}"
        fix = f"the copy is made in {library}, not in this script; {fix}"
        notes.append(f"library frame: {library}")
    counts = [Count("copies", len(chosen)), Count("steady steps", len(steps)), Count("bytes", nbytes, "B"),
              Count("time", seconds, "s")]
    target = facts.target
    if target is not None and target.host_bandwidth_per_device:
        counts.append(Count(f"copy time on {target} (estimated)", nbytes / target.host_bandwidth_per_device, "s"))
    return Finding(
        kind="d2h_every_step",
        severity="info" if library is not None else "warning",
        title=title,
        fix=fix,
        cost_seconds=seconds,
        evidence=Evidence(location, tuple(counts), tuple(notes)),
        steps=index_span(steps),
        cause=op,
        subject=f"{site_text(location)} ({op})",
    )



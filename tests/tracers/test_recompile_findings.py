"""Recompile findings on runs as they are recorded: what the guard or key tests decides the
group and the fix, never the values in its text; constants of two call sites are no changing
scalar; a sequence that grows a token per step is a size, fixed by a static cache only when
the KV cache is what grows; steps before the first repeat are warm-up.

The expected values come from the programs described (an LR schedule's values, the
lines of a script, the dtype and rank of a KV cache), not from the tool's output."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tpu_debug.tracers.advisor import recompile_rules as rules
from tpu_debug.tracers.advisor.facts import RunFacts
from tpu_debug.tracers.events import (
    ArgInfo,
    CompileEvent,
    KeyDiff,
    RecompileLimitEvent,
    SourceLocation,
    StepEvent,
)
from tpu_debug.tracers.reading.recompile_analysis import by_call_site, guard_subject, read_guard, summarize

import tpu_debug

TRAIN = "/src/train.py"


class _Run:
    """A recorded run as the rules read it: its steps, compiles and recompile-limit hits."""

    def __init__(self, steps, compiles, limits=()) -> None:
        self._steps, self._compiles, self._limits = list(steps), list(compiles), list(limits)
        self.recompiles = SimpleNamespace(limits=self.recompile_limits)  # session.recompiles.limits()

    def steps(self):
        return self._steps

    def compiles(self):
        return self._compiles

    def recompile_limits(self):
        return self._limits


def _at(line: int, function: str = "main") -> SourceLocation:
    return SourceLocation(TRAIN, line, function)


class _Recorder:
    """Builds events in time order: each step is one second; compiles fall inside their step."""

    def __init__(self) -> None:
        self.compiles: list[CompileEvent] = []
        self._id = 0

    def compile(self, step, name, args, line, *, mode="eager", identity=None, diffs=(), previous=None):
        self._id += 1
        ts = step + 0.01 * (len(self.compiles) % 90 + 1)
        event = CompileEvent(
            self._id, ts, mode, 0, _at(line), name, name, tuple(args), 0.05,
            previous=previous, diffs=tuple(diffs), identity=identity or name,
        )
        self.compiles.append(event)
        return event

    def run(self, n_steps: int, limits=()) -> RunFacts:
        steps = []
        for i in range(n_steps):
            here = [c for c in self.compiles if i <= c.ts < i + 1]
            # a step that compiles runs new programs; one that compiles nothing repeats the last
            sequence = f"s{i}" if here else "repeat"
            steps.append(StepEvent(
                1000 + i, float(i), None, 0, None, i, "optimizer", i + 1.0, 1.0,
                compiles=len(here), recompiles=sum(1 for c in here if c.diffs), sequence=sequence,
            ))
        return RunFacts(_Run(steps, self.compiles, limits))


def _t(name, *shape, dtype="float32"):
    return ArgInfo(name, tuple(shape), dtype)


# -- reading what a failed guard tests --------------------------------------------------------------


def _guard(text: str) -> KeyDiff:
    return read_guard(KeyDiff("guard", text, "failed", source="guard"))


def test_a_value_guard_on_any_source_is_the_python_value_it_names():
    lr = _guard("L['self'].param_groups[0]['lr'] == 0.0027075")
    assert (lr.aspect, lr.arg_name, lr.before, lr.source) == ("scalar", "self.param_groups[0]['lr']", "0.0027075", "guard")
    assert _guard("G['cfg'].scale == 2").arg_name == "cfg.scale"
    size = _guard("L['x'].size()[0] == 8")
    assert (size.aspect, size.arg_name, size.dims) == ("shape", "x", (0,))
    # a call is no Python value of the user's: kept as the guard's text
    assert _guard("len(L['xs']) == 3").aspect == "guard"
    assert _guard("___check_obj_id(L['m'], 1402)").aspect == "guard"


def test_a_guard_without_its_values_is_what_it_tests():
    assert guard_subject("___check_obj_id(L['m'], 1402)") == guard_subject("___check_obj_id(L['m'], 9977)")
    assert guard_subject("L['xs'][0] == 1.5") == "L['xs'][0] == ..."  # the index stays, the value goes


def test_a_recompile_is_read_against_its_own_line():
    facts = _two_constant_sites_run()
    read = by_call_site(facts.compiles)
    second_line = [c for c in read if c.location.line == BACKWARD]
    assert second_line[0].diffs == ()  # the first program of that line: no recompile
    # afterwards, each is its own line's exponent at a new length: dim 0 changed, not the exponent
    assert all([d.aspect for d in c.diffs] == ["shape"] and c.diffs[0].dims == (0,) for c in second_line[1:])


def test_a_view_of_a_growing_tensor_is_advised_as_growth_not_contiguity():
    sizes = tuple(f"(1, {n})" for n in range(9, 15))
    recompiles = [
        CompileEvent(i, float(i), "eager", 0, _at(12), "isin.Tensor_Tensor", "", (_t("elements", 1, dtype="int64"),),
                     0.01, diffs=(KeyDiff("layout", sizes[i - 1], sizes[i], arg_index=0, arg_name="elements",
                                          detail="storage"),) if i else ())
        for i in range(len(sizes))
    ]
    (group,) = summarize(recompiles)
    assert (group.changing.kind, group.changing.detail, group.changing.values) == ("layout", "storage", sizes)
    (advice,) = group.advice
    assert "grows at every call" in advice and "contiguous" not in advice


# -- a Python float learning rate changed by a scheduler, given to a compiled opt.step ---------

STEP_IDENTITY = "step in adam.py (forward)"
OPT_STEP_LINE = 23  # where the user's code calls opt.step(), whose Adam.step dynamo compiles
LRS = [0.003 * 0.95**k for k in range(8)]  # LambdaLR(opt, lambda step: 0.95 ** step), lr=3e-3


def _lr_schedule_run(*, as_text: bool, identity: str = STEP_IDENTITY) -> RunFacts:
    """Step 0 compiles the model's graphs and the optimizer step; every later step the scheduler's
    new lr fails dynamo's value guard on the lr the step was compiled for."""
    rec = _Recorder()
    rec.compile(0, "graph_0", [_t("x", 32, 64)], 14, mode="compiled", identity="train_step in train.py (forward)")
    rec.compile(0, "graph_1", [_t("g", 32, 10)], 17, mode="compiled", identity="train_step in train.py (backward)")
    rec.compile(0, "graph_2", [_t("p", 128, 64)], OPT_STEP_LINE, mode="compiled", identity=identity)
    for step in range(1, 8):
        guard = f"self.param_groups[0]['lr'] == {LRS[step - 1]!r}"
        diff = (KeyDiff("guard", guard, "failed", source="guard") if as_text else
                KeyDiff("scalar", repr(LRS[step - 1]), "changed", arg_name="self.param_groups[0]['lr']", source="guard"))
        rec.compile(step, "graph_2", [_t("p", 128, 64)], OPT_STEP_LINE, mode="compiled",
                    identity=identity, diffs=[diff])
    limit = RecompileLimitEvent(
        999, 8.5, "compiled", 0, _at(OPT_STEP_LINE, "opt_step"), "step", "recompile_limit", 8,
        f"self.param_groups[0]['lr'] == {LRS[7]!r}",
    )
    return rec.run(10, [limit])


def _lr_fix_is_right(fix: str) -> None:
    assert "self.param_groups[0]['lr']" in fix
    # the idiom of PyTorch's compiled-optimizer-with-scheduler recipe and Adam's lr docs
    assert "lr=torch.tensor(lr) and capturable=True" in fix
    assert "hoist" not in fix


def test_a_scheduled_float_lr_is_one_recompile_finding_naming_lr_and_the_tensor_idiom():
    for as_text in (True, False):  # stored as the guard's text (older runs) or read as a value
        facts = _lr_schedule_run(as_text=as_text)
        (finding,) = list(rules.recompile(facts))
        assert (finding.kind, finding.cause) == ("recompile", "scalar")
        assert finding.evidence.location.line == OPT_STEP_LINE
        assert finding.steps == (1, 7)  # step 1 only recompiles: it repeats step 0's work
        assert finding.evidence.count("recompiles in steady state") == 7
        assert "self.param_groups[0]['lr']" in finding.title
        # the values the step was compiled for: the schedule's, as written (0.95 * 0.003 = 0.00285)
        assert ", ".join(f"{v:.6g}" for v in LRS[:3]) == "0.003, 0.00285, 0.0027075"
        assert "(0.003, 0.00285, 0.0027075, " in finding.title
        _lr_fix_is_right(finding.fix)


def test_the_recompiles_view_names_the_lr_and_its_values_too():
    groups = {g.identity: g for g in summarize(_lr_schedule_run(as_text=True).compiles)}
    change = groups[STEP_IDENTITY].changing
    assert (change.kind, change.arg_name, change.count) == ("scalar", "self.param_groups[0]['lr']", 7)
    assert change.values == tuple(repr(v) for v in LRS[:7])  # the value each compile was made for
    (advice,) = groups[STEP_IDENTITY].advice
    assert "lr=torch.tensor(lr)" in advice and "capturable=True" in advice


def test_an_sgd_lr_is_wrapped_in_a_tensor_without_capturable():
    # SGD has no capturable option; a tensor lr is all it needs
    (finding,) = list(rules.recompile(_lr_schedule_run(as_text=True, identity="step in sgd.py (forward)")))
    assert "lr=torch.tensor(lr)" in finding.fix and "capturable" not in finding.fix


def test_the_recompile_limit_it_hits_names_lr_and_the_idiom_too():
    (finding,) = list(rules.recompile_limit(_lr_schedule_run(as_text=True)))
    assert finding.kind == "recompile_limit" and finding.evidence.location.line == OPT_STEP_LINE
    _lr_fix_is_right(finding.fix)


def test_guards_on_other_values_group_by_what_they_test():
    rec = _Recorder()
    rec.compile(0, "graph_0", [_t("x", 4)], 30, mode="compiled", identity="f in train.py (forward)")
    for step in range(1, 6):
        guard = f"___check_obj_id(L['cfg'], {140000 + step})"
        rec.compile(step, "graph_0", [_t("x", 4)], 30, mode="compiled", identity="f in train.py (forward)",
                    diffs=[KeyDiff("guard", guard, "failed", source="guard")])
    (finding,) = list(rules.recompile(rec.run(8)))
    assert (finding.cause, finding.evidence.location.line) == ("guard", 30)
    assert finding.evidence.count("recompiles in steady state") == 5
    assert "___check_obj_id(L['cfg'], ...)" in finding.fix


# -- constants of two call sites ------------------------------------------------------------------

FORWARD, BACKWARD = 9, 11  # y = (x * w).pow(2); loss.backward() runs pow(y, 0.5)'s own program


def _two_constant_sites_run() -> RunFacts:
    """pow.Tensor_Scalar at two lines, exponent 2 at one and 0.5 at the other, on a tensor whose
    length changes every step: the second line's closest earlier key is the first line's, of
    the same new length, so its recorded diff names the exponent."""
    rec = _Recorder()
    lengths = [5, 9, 7, 12, 6, 10]
    last: dict[int, CompileEvent] = {}
    for step, n in enumerate(lengths):
        fwd_diffs = [] if step == 0 else [
            KeyDiff("shape", f"f32[{lengths[step - 1]},6]", f"f32[{n},6]", arg_index=0, arg_name="self", dims=(0,))
        ]
        last[FORWARD] = rec.compile(step, "pow.Tensor_Scalar", [_t("self", n, 6), ArgInfo("exponent", static="2")],
                                    FORWARD, diffs=fwd_diffs, previous=last.get(FORWARD) and last[FORWARD].id)
        rec.compile(step, "pow.Tensor_Scalar", [_t("self", n, 6), ArgInfo("exponent", static="0.5")], BACKWARD,
                    diffs=[KeyDiff("scalar", "2", "0.5", arg_index=1, arg_name="exponent")], previous=last[FORWARD].id)
    return rec.run(len(lengths))


def test_constants_at_two_call_sites_are_not_one_changing_scalar():
    facts = _two_constant_sites_run()
    assert list(rules.recompile(facts)) == []
    (finding,) = list(rules.dynamic_shape(facts))
    assert (finding.kind, finding.cause) == ("dynamic_shape", "shape")
    assert finding.evidence.location.line == FORWARD
    assert "dim 0 of arg 0 'self' of pow.Tensor_Scalar" in finding.title
    # the six lengths 5..12 pad to multiples of 8: 8 and 16
    assert "multiple of 8" in finding.fix and "(8, 16)" in finding.fix
    assert "exponent" not in finding.fix


def test_a_scalar_that_changes_at_its_own_line_is_still_found():
    rec = _Recorder()
    alphas = [1.0 - 0.1 * k for k in range(6)]  # x.mul(alpha) with a Python float annealed per step
    for step, a in enumerate(alphas):
        diffs = [] if step == 0 else [KeyDiff("scalar", repr(alphas[step - 1]), repr(a), arg_index=1, arg_name="other")]
        rec.compile(step, "mul.Scalar", [_t("self", 8), ArgInfo("other", static=repr(a))], 40, diffs=diffs)
    (finding,) = list(rules.recompile(rec.run(6)))
    assert (finding.cause, finding.evidence.location.line) == ("scalar", 40)
    assert "'other'" in finding.fix and "torch.tensor(v, device='tpu')" in finding.fix


# -- a sequence that grows by one token per step (generate() without a static cache) -----------

GENERATE_LINE = 12


def _decode_run(*, kv_grows: bool) -> RunFacts:
    """Decode steps: generate() appends a token to the ids (cat of i64[1, n]) and reads the last
    one through a view of that buffer (isin); with a dynamic cache, the attention's keys
    f32[1, 4, n, 16] grow too. Recorded as the tracker does: the view's diff is its storage."""
    rec = _Recorder()
    prompt = 8
    for step in range(12):
        n = prompt + step
        grew = step > 0
        rec.compile(step, "cat", [_t("tensors[0]", 1, n, dtype="int64"), _t("tensors[1]", 1, 1, dtype="int64")],
                    GENERATE_LINE, diffs=[KeyDiff("shape", f"i64[1,{n - 1}]", f"i64[1,{n}]", arg_index=0,
                                                  arg_name="tensors[0]", dims=(1,))] if grew else [])
        rec.compile(step, "isin.Tensor_Tensor", [_t("elements", 1, dtype="int64"), _t("test_elements", 1, dtype="int64")],
                    GENERATE_LINE, diffs=[KeyDiff("layout", f"(1, {n - 1})", f"(1, {n})", arg_index=0,
                                                  arg_name="elements", detail="storage")] if grew else [])
        if kv_grows:
            rec.compile(step, "bmm", [_t("self", 4, 1, 16), _t("mat2", 4, 16, n)], GENERATE_LINE,
                        diffs=[KeyDiff("shape", f"f32[4,16,{n - 1}]", f"f32[4,16,{n}]", arg_index=1,
                                       arg_name="mat2", dims=(2,))] if grew else [])
            rec.compile(step, "cat", [_t("tensors[0]", 1, 4, n, 16), _t("tensors[1]", 1, 4, 1, 16)], GENERATE_LINE,
                        diffs=[KeyDiff("shape", f"f32[1,4,{n - 1},16]", f"f32[1,4,{n},16]", arg_index=0,
                                       arg_name="tensors[0]", dims=(2,))] if grew else [])
    return rec.run(12)


def test_a_growing_kv_cache_is_a_growing_size_fixed_by_a_static_cache():
    facts = _decode_run(kv_grows=True)
    assert list(rules.recompile(facts)) == []  # no "layout" finding about the ids' view
    (finding,) = list(rules.dynamic_shape(facts))
    assert (finding.kind, finding.cause, finding.evidence.location.line) == ("dynamic_shape", "shape", GENERATE_LINE)
    assert "grows at every call" in finding.fix and "cache_implementation='static'" in finding.fix
    assert "contiguous" not in finding.fix and "layout" not in finding.title


def test_with_a_static_cache_the_fix_names_what_still_grows_not_a_static_cache():
    facts = _decode_run(kv_grows=False)
    assert list(rules.recompile(facts)) == []
    (finding,) = list(rules.dynamic_shape(facts))
    assert (finding.kind, finding.evidence.location.line) == ("dynamic_shape", GENERATE_LINE)
    assert "cache_implementation='static'" not in finding.fix
    assert "a static cache changes nothing" in finding.fix and "i64 of rank 2" in finding.fix
    assert "token ids" in finding.fix and "contiguous" not in finding.fix


# -- warm-up: steps before the first repeat --------------------------------------------------------


def test_recompiles_while_every_step_still_compiles_new_work_are_warm_up():
    # five steps each compile a program for a new op (another phase of a model warming up)
    # while one op meets a new rank; from step 5 on the steps only repeat
    rec = _Recorder()
    for step in range(5):
        rec.compile(step, f"op{step}", [_t("self", 4)], 50 + step)
        if step:
            rec.compile(step, "sum", [_t("self", *([2] * (step + 1)))], 60,
                        diffs=[KeyDiff("shape", "f32[...]", "f32[...]", arg_index=0, arg_name="self", detail="rank")])
        else:
            rec.compile(step, "sum", [_t("self", 2)], 60)
    facts = rec.run(9)
    assert facts.phases[1] == "steady"  # the step tracker's own phases: a long warm-up counts as steady
    assert list(rules.recompile(facts)) == []


def test_two_pow_call_sites_in_a_real_eager_loop_are_a_dynamic_shape_only(tmp_path, cold_cache):
    w = torch.ones(6).to("tpu").requires_grad_()
    with tpu_debug.trace(logdir=tmp_path, name="pow", hlo=False) as session:
        for length in [5, 9, 7, 12, 6, 10]:
            x = torch.randn(length, 6).to("tpu")
            y = (x * w).pow(2)
            z = y.sum(1).pow(0.5)
            z.sum().backward()
            tpu_debug.step()
    kinds = [f.kind for f in session.findings()]
    assert "recompile" not in kinds and kinds.count("dynamic_shape") == 1


def _scheduled_adamw_loop(tmp_path, *, tensor_lr: bool):
    """A user's loop: AdamW with a LambdaLR, its opt.step() compiled, the scheduler stepped after it."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4).to("tpu")
    lr = torch.tensor(3e-3) if tensor_lr else 3e-3
    opt = torch.optim.AdamW(model.parameters(), lr=lr, capturable=tensor_lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.95**step)

    @torch.compile(backend="tpu_debug")
    def opt_step():
        opt.step()  # calls Adam.step, the function dynamo compiles again: the line the finding names

    with tpu_debug.trace(logdir=tmp_path, name="sched", hlo=False) as session:
        # four steps: the first compiles, and each of the three after it meets a new lr (a recompile
        # in steady state, dynamo tracing AdamW's step again), or, with the tensor lr, none
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(8, 16).to("tpu")).square().mean().backward()
            opt_step()
            sched.step()
    torch._dynamo.reset()
    return session.findings()


def test_a_scheduled_float_lr_in_a_real_compiled_optimizer_step(tmp_path, cold_cache):
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "opt.step()  # calls Adam.step" in text)
    (finding,) = [f for f in _scheduled_adamw_loop(tmp_path / "float", tensor_lr=False) if f.kind == "recompile"]
    assert finding.cause == "scalar" and finding.evidence.location.line == line
    assert "param_groups[0]['lr']" in finding.fix and "lr=torch.tensor(lr) and capturable=True" in finding.fix
    # the fix it names: the same loop with the tensor lr and capturable=True recompiles nothing
    fixed = _scheduled_adamw_loop(tmp_path / "tensor", tensor_lr=True)
    assert [f for f in fixed if f.kind in ("recompile", "recompile_limit", "dynamic_shape")] == []


def _generate(tmp_path, **options):
    """A user's greedy generate() on a tiny random GPT-2, eagerly on tpu."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=500, n_positions=64, n_embd=32, n_layer=1, n_head=2)
    model = transformers.GPT2LMHeadModel(config).eval().to("tpu")
    prompt = torch.randint(0, 500, (1, 6)).to("tpu")
    with tpu_debug.trace(logdir=tmp_path, name="generate", hlo=False) as session, torch.no_grad():
        # each token compiles every op again; six are the fewest after whose warm-up enough steady
        # steps remain for a size that grows at every step (recompile_rules._grows_each_step)
        model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0, **options)
    return [f for f in session.findings() if f.kind in ("recompile", "dynamic_shape")]


def test_generate_with_a_dynamic_cache_is_one_growing_size_fixed_by_a_static_cache(tmp_path, cold_cache):
    (finding,) = _generate(tmp_path)
    assert (finding.kind, finding.cause) == ("dynamic_shape", "shape")
    assert "cache_implementation='static'" in finding.fix and "contiguous" not in finding.fix


def test_generate_with_a_static_cache_is_not_told_to_use_one(tmp_path, cold_cache):
    findings = _generate(tmp_path, cache_implementation="static")
    assert findings, "generate() still extends the token ids one token at a time"
    for finding in findings:
        assert (finding.kind, finding.cause) == ("dynamic_shape", "shape")
        assert "cache_implementation='static'" not in finding.fix and "contiguous" not in finding.fix
        assert "token ids" in finding.fix


def _step_with_backward_inside(tmp_path, compile_step, *, detached: bool = True):
    """The whole step compiled with ``loss.backward()`` inside it, returning the loss detached
    or not; returns the run's findings."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def forward_backward(x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()  # where dynamo stops unless it traces autograd
        return loss.detach() if detached else loss

    step = compile_step(forward_backward)
    with tpu_debug.trace(logdir=tmp_path, name="fwd_bwd", hlo=False) as session:
        for _ in range(5):
            opt.zero_grad()
            step(torch.randn(8, 16).to("tpu"), torch.randint(0, 4, (8,)).to("tpu"))
            opt.step()
    torch._dynamo.reset()
    return session.findings()


def test_a_backward_inside_a_compiled_step_is_a_break_whose_fix_makes_one_program(tmp_path, cold_cache):
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "# where dynamo stops" in text)
    split = _step_with_backward_inside(tmp_path / "split", lambda f: torch.compile(f, backend="tpu_debug"))
    (finding,) = [f for f in split if f.kind == "graph_break"]
    assert finding.evidence.location.line == line and "the backward inside it" in finding.title
    assert finding.cause == "backward"
    assert "tpu_debug.compile" in finding.fix and "trace_autograd_ops = True" in finding.fix
    assert "loss.detach()" in finding.fix
    # both fixes it names leave no break: dynamo traces the backward into the step's graph
    assert not [f for f in _step_with_backward_inside(tmp_path / "ours", tpu_debug.compile) if f.kind == "graph_break"]

    def flagged(f):
        compiled = torch.compile(f, backend="tpu_debug")

        def call(*args):
            with torch._dynamo.config.patch(trace_autograd_ops=True):
                return compiled(*args)
        return call

    assert not [f for f in _step_with_backward_inside(tmp_path / "flag", flagged) if f.kind == "graph_break"]
    # traced, but the loss returned attached: dynamo breaks again, and the fix is the detach alone
    (attached,) = [f for f in _step_with_backward_inside(tmp_path / "attached", flagged, detached=False)
                   if f.kind == "graph_break"]
    assert attached.cause == "backward" and attached.fix.startswith("return loss.detach()")


# -- a Python container that grows inside a compiled function ----------------------------------------

QUEUE_LINE, CALL_LINE = 25, 41  # self.queue.append(k) in forward; loss = model(x) in the loop
FORWARD_ID = "forward in train.py (forward)"


def _growing_queue_run(*, hits_limit: bool) -> RunFacts:
    """A compiled forward that appends to ``self.queue`` at every call: each call fails the guard
    on the list's length and compiles forward and backward again, the backward's inputs one key
    longer. With ``hits_limit``, dynamo gives up at step 7 and the forward runs eagerly, its
    ``mm`` over the concatenated queue taking a new size at each step after that."""
    rec = _Recorder()
    rec.compile(0, "graph_0", [_t("x", 8, 32)], QUEUE_LINE, mode="compiled", identity=FORWARD_ID)
    rec.compile(0, "graph_1", [_t("g", 8, 8)], QUEUE_LINE, mode="compiled", identity="forward in train.py (backward)")
    last = 7 if hits_limit else 10
    for step in range(1, last):
        guard = [KeyDiff("guard", f"len(self.queue) == {step}", "failed", source="guard")]
        rec.compile(step, "graph_0", [_t("x", 8, 32)], QUEUE_LINE, mode="compiled", identity=FORWARD_ID, diffs=guard)
        rec.compile(step, "graph_1", [_t("g", 8, 8 * (step + 1))], QUEUE_LINE, mode="compiled",
                    identity="forward in train.py (backward)", diffs=[*guard, KeyDiff(
                        "shape", f"f32[8,{8 * step}]", f"f32[8,{8 * (step + 1)}]", arg_index=0, arg_name="g", dims=(1,))])
    limits = []
    if hits_limit:
        limits.append(RecompileLimitEvent(999, 7.005, "compiled", 0, _at(QUEUE_LINE, "forward"), "forward",
                                          "recompile_limit", 8, "len(self.queue) == 7"))
        for step in range(7, 12):
            rec.compile(step, "mm", [_t("self", 8, 16), _t("mat2", 16, 8 * step)], CALL_LINE, diffs=[KeyDiff(
                "shape", f"f32[16,{8 * (step - 1)}]", f"f32[16,{8 * step}]", arg_index=1, arg_name="mat2", dims=(1,))])
    return rec.run(12, limits)


def test_a_guard_on_a_growing_container_names_it_and_a_fixed_size_buffer():
    facts = _growing_queue_run(hits_limit=False)
    (finding,) = list(rules.recompile(facts))
    assert (finding.cause, finding.evidence.location.line) == ("guard", QUEUE_LINE)
    assert finding.title.startswith("self.queue, a Python container the compiled function reads, grows between calls")
    assert "fixed-size tensor buffer allocated once" in finding.fix and "wraps around" in finding.fix
    assert "pass a changing value in as a tensor" not in finding.fix
    # the backward graph recompiled because the guard failed: its longer input is no size to pad
    assert list(rules.dynamic_shape(facts)) == []
    assert set(finding.targets) == {FORWARD_ID, "forward in train.py (backward)"}


def test_a_container_that_made_the_function_run_uncompiled_gets_no_padding_advice():
    facts = _growing_queue_run(hits_limit=True)
    (limit,) = list(rules.recompile_limit(facts))
    assert "on the length of self.queue, a Python container it reads" in limit.title
    assert limit.fix.startswith("keep what self.queue holds in a fixed-size tensor buffer allocated once")
    # the eager mm the uncompiled forward runs on the ever longer queue: the same cause, no padding
    assert list(rules.dynamic_shape(facts)) == []
    assert all(f.cause == "guard" for f in rules.recompile(facts))


# -- the persistent compile cache ---------------------------------------------------------------------


def test_shapes_read_back_from_the_compile_cache_are_the_same_findings_as_shapes_compiled():
    import dataclasses

    def run(from_cache: bool) -> RunFacts:
        rec = _Recorder()
        last = None
        for step, n in enumerate([5, 9, 7, 12, 6, 10, 11]):
            diffs = [] if last is None else [
                KeyDiff("shape", f"f32[{last},6]", f"f32[{n},6]", arg_index=0, arg_name="self", dims=(0,))]
            rec.compile(step, "exp", [_t("self", n, 6)], 12, diffs=diffs)
            last = n
        rec.compiles[:] = [dataclasses.replace(c, from_cache=from_cache) for c in rec.compiles]
        return rec.run(7)

    compiled, read_back = list(rules.dynamic_shape(run(False))), list(rules.dynamic_shape(run(True)))
    assert [f.key for f in read_back] == [f.key for f in compiled] and len(compiled) == 1
    assert (read_back[0].evidence.location, read_back[0].fix) == (compiled[0].evidence.location, compiled[0].fix)
    assert "reading them back from the compile cache" in read_back[0].title and "compiling" in compiled[0].title
    # what XLA compiled in this run is what summarize counts by default
    assert summarize(run(True).compiles)[0].recompiles == 0
    assert summarize(run(True).compiles, read_backs_apart=False)[0].recompiles == 6

from __future__ import annotations

import dataclasses
import json
import re
import sqlite3
from typing import ClassVar

import pytest
from tpu_debug.core.errors import NotRecordedError, RunDamagedError, RunNotFoundError, SchemaVersionError
from tpu_debug.core.records import FallbackInfo, TransferInfo
from tpu_debug.tracers import events as ev
from tpu_debug.tracers.hlo import make_program
from tpu_debug.tracers.reading import RunQuery
from tpu_debug.tracers.recording.run_writer import RunWriter
from tpu_debug.tracers.store import APPLICATION_ID, layout

LOC = ev.SourceLocation("/work/user/train.py", 12, "step")
LOC2 = ev.SourceLocation("/work/user/train.py", 30, "main")

HLO = """HloModule jit_traced, is_scheduled=true

ENTRY %main.1 (flat_0_.1: f32[4], flat_1_.1: f32[4]) -> f32[4] {
  %flat_0_.1 = f32[4]{0} parameter(0), metadata={op_name="flat[0]"}
  %flat_1_.1 = f32[4]{0} parameter(1), metadata={op_name="flat[1]"}
  ROOT %wrapped_multiply = f32[4]{0} fusion(%flat_0_.1, %flat_1_.1), kind=kLoop, calls=%c, metadata={op_name="jit(traced)/aten::mul.Tensor/mul"}
}
"""
STABLEHLO = "module @jit_traced { func.func public @main() { stablehlo.multiply } }"


def _write_all_kinds(writer: RunWriter) -> list[ev.Event]:
    program = writer.add_program(make_program("eager", "mul.Tensor", STABLEHLO, HLO))
    args = (ev.ArgInfo("self", (4,), "float32"), ev.ArgInfo("other", (4,), "float32"))
    nid = writer.new_id
    out = [
        ev.CompileEvent(
            nid(),
            0.1,
            "eager",
            11,
            LOC,
            "mul.Tensor",
            "mul.Tensor(float32[4], float32[4])",
            args,
            0.03,
            program,
        ),
        ev.CompileEvent(
            nid(),
            0.2,
            "eager",
            11,
            LOC2,
            "mul.Tensor",
            "mul.Tensor(float32[5], float32[4])",
            (ev.ArgInfo("self", (5,), "float32"), ev.ArgInfo("dim", static="1")),
            0.04,
            None,
            previous=1,
            diffs=(ev.KeyDiff("shape", "float32[4]", "float32[5]", arg_index=0, arg_name="self", dims=(0,)),),
        ),
        ev.OpEvent(nid(), 0.3, "eager", 11, LOC, "mul.Tensor", 2e-5, program),
        ev.TransferEvent(nid(), 0.4, None, 11, LOC2, TransferInfo("d2h", 4, (), "float32", "item", 1e-4), op="item", implicit=True),
        ev.TransferEvent(nid(), 0.5, None, 12, None, TransferInfo("h2d", 64, (4, 4), "float32", "copy", 2e-4), op="copy", implicit=False),
        ev.FallbackEvent(nid(), 0.6, "eager", 11, LOC, FallbackInfo("nonzero", (ev.ArgInfo("self", (4,), "bool"),), 1e-3)),
        ev.GraphBreakEvent(nid(), 0.7, "compiled", 11, LOC2, "forward", "call to .item()"),
        ev.DivergenceEvent(
            nid(), 0.8, "eager", 11, LOC, "mul.Tensor", "local", 1e-3, 2e-4, 12.0, 3, False, 1e-5, True
        ),
        ev.InternalErrorEvent(nid(), 0.9, None, 11, None, "Recorder.on_compile", "ValueError: x"),
    ]
    for e in out:
        writer.put(e)
    return out


@pytest.mark.quick
def test_round_trip_every_event_kind(tmp_path):
    db = tmp_path / "run.db"
    writer = RunWriter(db, {"name": "demo", "argv": ["train.py", "--lr", "0.1"]})
    written = _write_all_kinds(writer)
    writer.close({"status": "finished", "exit_status": 0})
    assert writer.error is None

    q = RunQuery(db)
    back = q.events()
    assert back == written
    assert q.events("transfer") == [e for e in written if e.kind == "transfer"]
    assert q.events("transfer", name="item") == [written[3]]
    assert q.events(start=0.45, end=0.75) == written[4:7]
    assert q.events(limit=2, offset=1) == written[1:3]
    assert q.counts() == {
        "compile": 2,
        "divergence": 1,
        "fallback": 1,
        "graph_break": 1,
        "internal_error": 1,
        "op": 1,
        "transfer": 2,
    }
    assert q.compiles()[1].diffs == (
        ev.KeyDiff("shape", "float32[4]", "float32[5]", arg_index=0, arg_name="self", dims=(0,)),
    )
    assert q.transfers(direction="h2d") == [written[4]]
    meta = q.metadata()
    assert (meta.name, meta.argv, meta.status, meta.exit_status) == (
        "demo",
        ("train.py", "--lr", "0.1"),
        "finished",
        0,
    )
    q.close()


def test_program_stored_once_per_content_hash(tmp_path):
    db = tmp_path / "run.db"
    writer = RunWriter(db, {"name": "demo"})
    first = make_program("eager", "mul.Tensor", STABLEHLO, HLO)
    h1 = writer.add_program(first)
    h2 = writer.add_program(make_program("eager", "mul.Tensor", STABLEHLO, HLO))
    assert h1 == h2 and writer.has_program(h1)
    writer.close()
    q = RunQuery(db)
    assert q.connection.execute("SELECT count(*) FROM programs").fetchone()[0] == 1
    text = q.programs.text(h1)
    assert (text.hlo, text.stablehlo, text.name) == (HLO, STABLEHLO, "mul.Tensor")
    assert q.programs.hlo(h1) == HLO and q.programs.hlo("aten::mul.Tensor", stage="stablehlo") == STABLEHLO
    q.close()


def test_op_stats_are_updated_in_place(tmp_path):
    db = tmp_path / "run.db"
    writer = RunWriter(db, {"name": "demo"})
    rows = [(1, "eager", "mul.Tensor", "mul.Tensor(float32[4])", None, 3, 0.003)]
    writer.set_stats_source(lambda: rows)
    assert writer.flush()
    rows = [
        (1, "eager", "mul.Tensor", "mul.Tensor(float32[4])", None, 10, 0.01),
        (2, "eager", "add.Tensor", "add.Tensor(float32[4])", None, 2, 0.5),
    ]
    writer.close()
    q = RunQuery(db)
    ops = q.ops()
    assert [(o.name, o.count, o.seconds) for o in ops] == [("add.Tensor", 2, 0.5), ("mul.Tensor", 10, 0.01)]
    assert ops[0].mean_seconds == 0.25
    q.close()


def test_counts_read_before_their_program_is_stored_keep_the_program(tmp_path):
    """The writer reads the counters after taking a batch from the queue: an op compiled and run
    in between has counts while its program is still queued. Its row is stored with the batch
    that stores the program, so the program's executions are counted."""
    db = tmp_path / "run.db"
    writer = RunWriter(db, {"name": "demo"}, commit_interval=60)
    program = make_program("eager", "mul.Tensor", STABLEHLO, HLO)
    readings = [[(1, "eager", "mul.Tensor", "mul.Tensor(float32[4])", program.hash, 1, 0.002)]]
    writer.set_stats_source(lambda: readings.pop() if readings else [])
    assert writer.flush()  # the counters are read; the program is not queued yet
    writer.add_program(program)
    writer.close()
    q = RunQuery(db)
    (summary,) = q.programs()
    assert (summary.hash, summary.count, summary.seconds) == (program.hash, 1, 0.002)
    assert [(o.name, o.count) for o in q.ops()] == [("mul.Tensor", 1)]
    q.close()


def test_live_reader_sees_flushed_events(tmp_path):
    db = tmp_path / "run.db"
    writer = RunWriter(db, {"name": "demo"}, commit_interval=60)
    q = RunQuery(db)
    writer.put(ev.InternalErrorEvent(writer.new_id(), 0.0, None, 1, None, "x", "y"))
    assert writer.flush()
    assert q.counts() == {"internal_error": 1}
    assert q.metadata().status == "running"
    writer.close({"status": "finished"})
    q.close()


def test_writer_failure_never_reaches_the_program(tmp_path):
    db = tmp_path / "run.db"
    writer = RunWriter(db, {"name": "demo"})
    writer.put(object())  # not storable: the writer thread fails
    writer.put(ev.InternalErrorEvent(writer.new_id(), 0.0, None, 1, None, "x", "y"))
    assert writer.flush(timeout=10) is False
    writer.close()
    assert isinstance(writer.error, TypeError)
    assert "cannot store object objects" in str(writer.error)


def test_run_files_hold_no_pickles(tmp_path):
    db = tmp_path / "run.db"
    writer = RunWriter(db, {"name": "demo", "options": {"hlo": True}})
    _write_all_kinds(writer)
    writer.close()
    conn = sqlite3.connect(db)
    for (value,) in conn.execute("SELECT value FROM meta"):
        json.loads(value)
    for table in ("compiles", "fallbacks"):
        for (args,) in conn.execute(f"SELECT args FROM {table}"):
            json.loads(args)
    blobs = conn.execute(
        "SELECT count(*) FROM events WHERE typeof(name) = 'blob' OR typeof(seconds) = 'blob'"
    ).fetchone()[0]
    assert blobs == 0
    conn.close()


# -- bad input: one line, naming the file, saying what to do ------------------------------


def test_missing_database(tmp_path):
    missing = tmp_path / "nope" / "run.db"
    with pytest.raises(
        RunNotFoundError,
        match=re.escape(f"{missing}: no such run database. List recorded runs with 'tpu-debug runs'."),
    ):
        _ = RunQuery(missing).connection


def test_garbage_file(tmp_path):
    db = tmp_path / "run.db"
    db.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(
        RunDamagedError,
        match=re.escape(
            f"{db}: not a readable tpu_debug run (file is not a database). "
            "The file is damaged or truncated; re-record the run."
        ),
    ):
        _ = RunQuery(db).connection


def test_sqlite_file_that_is_not_a_run(tmp_path):
    db = tmp_path / "other.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(
        RunDamagedError,
        match=re.escape(
            f"{db}: not a tpu_debug run database (application id 0x0). "
            "Point at a run directory under tpu_debug_runs/, or re-record the run."
        ),
    ):
        _ = RunQuery(db).connection


def _with_schema(db, version: int) -> None:
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version={version}")
    conn.commit()
    conn.close()


@pytest.mark.quick
def test_run_from_a_newer_schema_names_both_versions_and_the_upgrade(tmp_path):
    db = tmp_path / "run.db"
    RunWriter(db, {"name": "demo", "tpu_debug_version": "9.0"}).close()
    _with_schema(db, ev.SCHEMA_VERSION + 1)
    with pytest.raises(
        SchemaVersionError,
        match="^"
        + re.escape(
            f"{db} is schema {ev.SCHEMA_VERSION + 1} (written by tpu_debug 9.0); this tpu_debug 0.1.0 reads "
            f"schema {ev.OLDEST_READABLE_SCHEMA} to {ev.SCHEMA_VERSION}. Upgrade tpu_debug (pip install -U tpu-debug) to read it, or "
            "re-record the run with this one."
        )
        + "$",
    ):
        _ = RunQuery(db).connection


def test_run_from_an_older_schema_says_re_record(tmp_path):
    db = tmp_path / "run.db"
    RunWriter(db, {"name": "demo", "tpu_debug_version": "0.0.9"}).close()
    _with_schema(db, ev.OLDEST_READABLE_SCHEMA - 1)
    with pytest.raises(
        SchemaVersionError,
        match="^"
        + re.escape(
            f"{db} is schema {ev.OLDEST_READABLE_SCHEMA - 1} (written by tpu_debug 0.0.9); this tpu_debug 0.1.0 "
            f"reads schema {ev.OLDEST_READABLE_SCHEMA} to {ev.SCHEMA_VERSION}. Re-record the run, or read it with the tpu_debug that "
            "wrote it."
        )
        + "$",
    ):
        _ = RunQuery(db).connection


def test_truncated_database(tmp_path):
    db = tmp_path / "run.db"
    writer = RunWriter(db, {"name": "demo"})
    for _ in range(3000):
        writer.put(ev.InternalErrorEvent(writer.new_id(), 0.0, None, 1, None, "x" * 50, "y" * 200))
    writer.close()
    data = db.read_bytes()
    assert len(data) > 100_000
    db.write_bytes(data[: len(data) // 3])
    with pytest.raises(
        RunDamagedError,
        match=r"^"
        + re.escape(f"{db}: not a readable tpu_debug run (")
        + r".*\)\. The file is damaged or truncated; re-record the run\.$",
    ):
        RunQuery(db).events("internal_error")


def test_hlo_of_something_not_recorded(tmp_path):
    db = tmp_path / "run.db"
    RunWriter(db, {"name": "demo"}).close()
    with pytest.raises(
        NotRecordedError,
        match=re.escape(
            f"{db}: no HLO recorded for 'conv2d': it names no op, FX node, graph or program of this run. "
            "This run recorded no HLO (it was traced with hlo=False, or ran no ops)."
        ),
    ):
        RunQuery(db).programs.hlo("aten::conv2d")


def test_application_id_marks_the_file(tmp_path):
    db = tmp_path / "run.db"
    RunWriter(db, {"name": "demo"}).close()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


# -- an event kind is one declaration -------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Note:
    """A record a test event carries in a child table."""

    label: str
    weight: float
    flagged: bool


@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointEvent(ev.Event):
    """A kind this test module alone declares: nothing in store.py or query.py knows it."""

    kind: ClassVar[str] = "checkpoint"
    stored: ClassVar[ev.Stored] = ev.Stored("checkpoints", name="path", seconds="seconds")

    path: str
    nbytes: int
    seconds: float
    tensors: tuple[str, ...]
    sharded: bool
    step: int | None = ev.column("step_number", default=None)  # a column named otherwise
    args: tuple[ev.ArgInfo, ...] = ()
    notes: tuple[_Note, ...] = ev.column(table="checkpoint_notes", default=())
    verified: bool | None = None


@pytest.fixture
def checkpoint_kind():
    ev.register_event(CheckpointEvent)
    yield CheckpointEvent
    del ev.EVENT_TYPES[CheckpointEvent.kind]


def test_a_kind_declared_in_one_place_round_trips(tmp_path, checkpoint_kind):
    db = tmp_path / "run.db"
    writer = RunWriter(db, {"name": "demo"})
    nid = writer.new_id
    written = [
        CheckpointEvent(
            nid(),
            0.5,
            None,
            3,
            LOC,
            "/ckpt/step10.pt",
            4096,
            0.25,
            ("w", "b"),
            True,
            10,
            (ev.ArgInfo("w", (4, 4), "float32"), ev.ArgInfo("lr", static="0.1")),
            (_Note("fast", 1.5, False), _Note("slow", 0.25, True)),
            False,
        ),
        CheckpointEvent(nid(), 0.7, "eager", 3, None, "/ckpt/step20.pt", 0, 0.0, (), False),
    ]
    compile_ = ev.CompileEvent(nid(), 0.6, "eager", 3, LOC2, "mul.Tensor", "sig", (), 0.1)
    for e in (written[0], compile_, written[1]):
        writer.put(e)
    writer.close()
    assert writer.error is None

    q = RunQuery(db)
    assert q.events("checkpoint") == written
    assert q.events("checkpoint", name="/ckpt/step20.pt") == [written[1]]
    assert q.events() == [*written, compile_]  # merged with the other kinds, in id order
    assert q.counts() == {"checkpoint": 2, "compile": 1}
    columns = [r[1] for r in q.connection.execute("PRAGMA table_info(checkpoints)")]
    assert columns == [
        "event_id",
        "nbytes",
        "tensors",
        "sharded",
        "step_number",
        "args",
        "verified",
    ]
    q.close()


def test_a_run_recorded_before_a_kind_existed_reads_as_none_of_it(tmp_path, checkpoint_kind):
    db = tmp_path / "run.db"
    del ev.EVENT_TYPES["checkpoint"]
    RunWriter(db, {"name": "demo"}).close()  # no checkpoints table
    ev.register_event(CheckpointEvent)
    q = RunQuery(db)
    assert q.events("checkpoint") == [] and q.events() == []
    q.close()


def test_a_kind_registered_after_the_run_began_gets_its_tables(tmp_path, checkpoint_kind):
    db = tmp_path / "run.db"
    del ev.EVENT_TYPES["checkpoint"]
    writer = RunWriter(db, {"name": "demo"})
    ev.register_event(CheckpointEvent)
    event = CheckpointEvent(writer.new_id(), 0.1, None, 1, None, "/c.pt", 1, 0.0, (), False)
    writer.put(event)
    writer.close()
    assert writer.error is None and RunQuery(db).events("checkpoint") == [event]


def test_declarations_the_store_cannot_keep_are_refused_with_the_reason():
    @dataclasses.dataclass(frozen=True, slots=True)
    class Odd(ev.Event):
        kind: ClassVar[str] = "odd"
        stored: ClassVar[ev.Stored] = ev.Stored("odds")
        payload: dict

    with pytest.raises(
        TypeError, match=r"^Odd\.payload: the run store cannot keep a field of type <class 'dict'>"
    ):
        layout(Odd)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Untabled(ev.Event):
        kind: ClassVar[str] = "untabled"
        stored: ClassVar[ev.Stored] = ev.Stored(None)
        size: int

    with pytest.raises(TypeError, match=r"^Untabled: fields size need a detail table"):
        layout(Untabled)

    with pytest.raises(ValueError, match=r"^event kind 'compile' is registered twice: "):

        @ev.register_event
        @dataclasses.dataclass(frozen=True, slots=True)
        class Again(ev.Event):
            kind: ClassVar[str] = "compile"
            stored: ClassVar[ev.Stored] = ev.Stored(None)


def test_the_declarations_give_the_layout_readers_rely_on(tmp_path):
    db = tmp_path / "run.db"
    RunWriter(db, {"name": "demo"}).close()
    conn = sqlite3.connect(db)
    cols = {
        t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")]
        for t in ("compiles", "key_diffs", "transfers")
    }
    conn.close()
    assert cols == {
        # then how its time was spent (measured phases), its dynamo compile, its HLO counts, its cache entry
        "compiles": ["event_id", "signature", "args", "previous_id", "identity", "from_cache", "saved_seconds",
                     "wall_seconds", "lower_seconds", "xla_seconds", "read_seconds", "frame", "hlo_before", "hlo_after",
                     "cache_entry", "cache_miss", "cache_miss_detail"],
        "key_diffs": [
            "event_id",
            "position",
            "aspect",
            "before",
            "now",
            "arg_index",
            "arg_name",
            "dims",
            "detail",
            "source",
        ],
        # the runtime's record first (its op under runtime_op: "op" is the cause, as it always was)
        "transfers": [
            "event_id", "direction", "nbytes", "shape", "dtype", "runtime_op", "digest", "compile_seconds", "implicit",
            "context", "origin", "follows", "module", "made_line",
        ],
    }

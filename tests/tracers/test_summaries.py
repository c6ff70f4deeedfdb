"""The run summaries (divergence, TensorBoard, dry run, process, collectives target): each
is a typed event the writer stores and ``RunQuery`` reads back as that type; runs of the
previous layout, which kept them as JSON objects in ``meta``, read the same way."""

from __future__ import annotations

import json
import sqlite3

import pytest
from tpu_debug.tracers import events as ev
from tpu_debug.tracers.reading import RunQuery
from tpu_debug.tracers.recording.run_writer import RunWriter
from tpu_debug.core.errors import RunDamagedError

LOC = ev.SourceLocation("/work/user/train.py", 12, "step")

DIVERGENCE = {
    "numerics": "tpu", "precision": "default", "tolerances": "float32=1e-05:1e-06", "sample": 2, "ops_compared": 120,
    "ops_copied": 3, "graphs_compared": 2, "nodes_compared": 40, "over_local": 1, "over_drift": 4, "nan_origins": 1,
    "not_compared": (ev.UncomparedOp("_foo.default", "RuntimeError: no CPU kernel"),),
    "sites": (
        ev.DivergenceSite("eager", "local", "forward", None, "mm", "/work/user/train.py", 12, 9, 5),
        ev.DivergenceSite("compiled", "drift", "backward", "g1/backward", "mul_3", None, None, 2, 2),
    ),
}
TENSORBOARD = {
    "status": "capped", "dir": "/runs/r/tensorboard", "profile": ("plugins/profile/a/vm.xplane.pb",), "spans": 12,
    "max_events": 12, "capped": True, "capped_after_seconds": 1.5, "dropped_spans": 30, "steps": 2,
    "notes": ("capture stopped after 12 spans",),
}
DRY_RUN = {"target": "v5e:2x2", "programs": 7, "notes": ("a value was read: the dry run stops there",)}
PROCESS = {"rank": 1, "world_size": 2, "devices": 8, "local_devices": 4, "coordinator": "localhost:4321"}
COLLECTIVES_TARGET = {"target": "v5e", "unfinished": 3}

SUMMARIES = [
    (ev.DivergenceSummaryEvent, DIVERGENCE, lambda q: q.divergences.summary()),
    (ev.TensorBoardSummaryEvent, TENSORBOARD, RunQuery.tensorboard_summary),
    (ev.DryRunSummaryEvent, DRY_RUN, RunQuery.dry_run_summary),
    (ev.ProcessEvent, PROCESS, RunQuery.process),
    (ev.CollectivesTargetEvent, COLLECTIVES_TARGET, RunQuery.collectives_target),
]


@pytest.mark.parametrize(("cls", "fields", "read"), SUMMARIES, ids=[c.kind for c, _, _ in SUMMARIES])
def test_each_summary_round_trips_as_its_type(tmp_path, cls, fields, read):
    db = tmp_path / "run.db"
    writer = RunWriter(db, {"name": "demo"})
    written = cls(writer.new_id(), 2.5, None, 7, None, **fields)
    writer.put(written)
    writer.close()
    got = read(RunQuery(db))
    assert type(got) is cls and got == written
    for name, value in fields.items():  # field by field, against the values written
        assert getattr(got, name) == value


@pytest.mark.parametrize(("cls", "fields", "read"), SUMMARIES, ids=[c.kind for c, _, _ in SUMMARIES])
def test_a_run_without_the_summary_has_none(tmp_path, cls, fields, read):
    db = tmp_path / "run.db"
    RunWriter(db, {"name": "demo"}).close()
    assert read(RunQuery(db)) is None


def test_the_last_summary_is_the_runs(tmp_path):
    # the TensorBoard export records one when it starts and one when it stops
    db = tmp_path / "run.db"
    writer = RunWriter(db, {"name": "demo"})
    for status, spans in (("capturing", 0), ("finished", 31)):
        writer.put(ev.TensorBoardSummaryEvent(writer.new_id(), 0.0, None, 1, None, status=status, spans=spans))
    writer.close()
    tb = RunQuery(db).tensorboard_summary()
    assert (tb.status, tb.spans) == ("finished", 31)


def _schema_6_run(db, meta: dict) -> None:
    """A run as the previous layout wrote it: summaries as JSON objects in ``meta``."""
    RunWriter(db, {"name": "old"}).close()
    conn = sqlite3.connect(db)
    conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in meta.items()])
    for table in ("divergence_summaries", "divergence_sites", "divergence_uncompared", "tensorboard_summaries",
                  "dry_run_summaries", "processes", "collectives_targets"):
        conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute("PRAGMA user_version=6")
    conn.commit()
    conn.close()


def test_a_schema_6_run_reads_its_json_summaries_as_the_types(tmp_path):
    db = tmp_path / "run.db"
    # the objects exactly as the schema 6 writers put them into meta
    _schema_6_run(db, {
        "divergence": {
            "numerics": "tpu", "precision": "default", "tolerances": "float32=1e-05:1e-06", "sample": 2,
            "ops_compared": 120, "ops_copied": 3, "graphs_compared": 2, "nodes_compared": 40,
            "over_tolerance": {"local": 1, "drift": 4}, "nan_origins": 1,
            "not_compared": {"_foo.default": "RuntimeError: no CPU kernel"},
            "sites": [
                {"mode": "eager", "measure": "local", "phase": "forward", "graph": None, "name": "mm",
                 "file": "/work/user/train.py", "line": 12, "count": 9, "recorded": 5},
                {"mode": "compiled", "measure": "drift", "phase": "backward", "graph": "g1/backward",
                 "name": "mul_3", "file": None, "line": None, "count": 2, "recorded": 2},
            ],
        },
        "tensorboard": {"status": "capped", "dir": "/runs/r/tensorboard",
                        "profile": ["plugins/profile/a/vm.xplane.pb"], "spans": 12, "max_events": 12,
                        "capped": True, "capped_after_seconds": 1.5, "dropped_spans": 30, "steps": 2,
                        "notes": ["capture stopped after 12 spans"]},
        "dry_run": {"target": "v5e:2x2", "programs": 7, "notes": ["a value was read: the dry run stops there"]},
        "distributed": {"rank": 1, "world_size": 2, "devices": 8, "local_devices": 4,
                        "coordinator": "localhost:4321"},
        "collectives_target": {"target": "v5e", "unfinished": 3},
    })
    q = RunQuery(db)
    for cls, fields, read in SUMMARIES:
        got = read(q)
        assert type(got) is cls
        for name, value in fields.items():
            assert getattr(got, name) == value, (cls.kind, name)


def test_a_schema_6_run_without_summaries_has_none(tmp_path):
    db = tmp_path / "run.db"
    _schema_6_run(db, {})
    q = RunQuery(db)
    assert [read(q) for _, _, read in SUMMARIES] == [None] * len(SUMMARIES)


def test_a_schema_6_tensorboard_failure_keeps_its_status_and_notes(tmp_path):
    db = tmp_path / "run.db"
    _schema_6_run(db, {"tensorboard": {"status": "failed", "notes": ["OSError: disk full"]}})
    tb = RunQuery(db).tensorboard_summary()
    assert (tb.status, tb.notes, tb.profile, tb.spans) == ("failed", ("OSError: disk full",), (), 0)


def test_a_damaged_schema_6_summary_says_damaged(tmp_path):
    db = tmp_path / "run.db"
    _schema_6_run(db, {"dry_run": {"programs": 7}})  # no target: cut short
    with pytest.raises(RunDamagedError, match=r"not a readable tpu_debug run \(TypeError: .*'target'"):
        RunQuery(db).dry_run_summary()


def test_a_traced_dry_run_records_its_summary(tmp_path, monkeypatch):
    from tpu_debug.runtime.target._libtpu import _find_libtpu

    if not _find_libtpu():
        pytest.skip('needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it')
    import gc

    import torch

    import tpu_debug

    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path / "target-cache"))
    gc.collect()  # tensors other tests left to the collector are live tpu tensors to a trace
    with tpu_debug.trace(logdir=tmp_path / "runs", dry_run=True, target="v5e") as session:
        x = torch.empty(256, 256, device="tpu")
        (x @ x).sum()
    dry = session.dry_run_summary()
    # every program the dry run lowered is compiled once for the target: one compile event each
    assert (dry.target, dry.programs) == ("v5e", len(session.events("compile")))
    assert dry.programs >= 2  # the matmul and the sum
    assert session.process() is None  # a single-process run

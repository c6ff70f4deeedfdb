"""XLA's "Involuntary full rematerialization" warnings: caught around the runtime's compiles,
recorded as events at the user's line and made a finding; everything else on stderr kept.

The reference is XLA itself: the same shardings compiled by plain JAX (no tpu_debug) print the
warning on stderr, with the shardings the recorded event must name.
"""

from __future__ import annotations

import json
import re
import textwrap

from dist_helpers import REPO, run_python
from tpu_debug.runtime.distributed.xla_log import parse_line

_SCRIPT = '''
import json, sys
import jax, numpy as np, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

# the reference: plain JAX, the same layouts, before tpu_debug exists in the process
jmesh = Mesh(np.asarray(jax.devices()).reshape(4, 2), ("x", "y"))
ja = jax.device_put(jnp.ones((16, 16, 16)), NamedSharding(jmesh, P("y", None, "x")))
jc = jax.device_put(jnp.ones((16, 16, 16)), NamedSharding(jmesh, P(None, ("x", "y"), None)))
jax.jit(lambda a, c: (a * 2 + c).sum()).lower(ja, jc).compile()
sys.stderr.flush()
print("REFERENCE DONE", file=sys.stderr, flush=True)

import torch, tpu_debug
from tpu_debug.runtime import distributed as dist

mesh = dist.init_device_mesh("tpu", (4, 2), mesh_dim_names=("x", "y"))
def put(spec):
    return dist.mark_sharding(torch.ones(16, 16, 16, device="tpu"), mesh, spec)

def bad(a, c):
    return (a * 2 + c).sum()  # LINE bad

def good(a, c):
    return (a * 2 + c).sum()

with tpu_debug.trace(logdir=sys.argv[1], name="remat") as session:
    a, c = put(("y", None, "x")), put((None, ("x", "y"), None))
    tpu_debug.compile(bad)(a, c).item()
    a2, c2 = put(("y", None, "x")), put(("y", None, "x"))
    tpu_debug.compile(good)(a2, c2).item()  # LINE good
    (a2 + c2).sum().item()  # a correct eager op on sharded tensors
events = [dict(name=e.name, mode=e.mode, line=e.location.line if e.location else None, node=e.node,
               aten_op=e.aten_op, source=e.from_sharding, wanted=e.to_sharding)
          for e in session.events("sharding_remat")]
findings = [f.to_dict() for f in session.findings() if f.kind == "sharding_remat"]
print(json.dumps({"events": events, "findings": findings}))
'''

_REMAT = re.compile(r"Involuntary full rematerialization.*?go from sharding (\{.*?\}) to (\{.*?\})")


def _line(source: str, marker: str) -> int:
    (line,) = [i for i, text in enumerate(source.splitlines(), 1) if marker in text]
    return line


def test_a_rematerialization_is_an_event_and_a_finding_at_the_users_line(tmp_path):
    script = tmp_path / "remat.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    proc = run_python([str(script), str(tmp_path / "runs")], devices=8, cwd=tmp_path, TPU_DEBUG_COMPILE_CACHE="0")
    assert proc.returncode == 0, proc.stderr[-4000:]
    reference, traced = proc.stderr.split("REFERENCE DONE", 1)
    expected = _REMAT.findall(reference)
    assert expected, f"XLA printed no rematerialization warning for the reference program:\n{reference[-3000:]}"
    # under the trace XLA's lines are recorded, not printed
    assert "Involuntary full rematerialization" not in traced, traced[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    compiled = [e for e in out["events"] if e["mode"] == "compiled"]
    # one program, the bad one: nothing from the correct compiled program or the correct eager op
    assert compiled and len({e["name"] for e in out["events"]}) == 1, out["events"]
    assert _line(_SCRIPT, "# LINE good") not in {e["line"] for e in out["events"]}
    # XLA's own pair of shardings, and the user's line of the FX node it names
    assert {(e["source"], e["wanted"]) for e in compiled} == set(expected)
    by_node = [e for e in compiled if e["node"]]
    assert by_node and all(e["line"] == _line(_SCRIPT, "# LINE bad") for e in by_node), compiled
    (finding,) = out["findings"]
    assert finding["evidence"]["location"]["line"] == _line(_SCRIPT, "# LINE bad")
    assert finding["targets"] == [compiled[0]["name"]] and "shard them the same way" in finding["fix"]


_CAPTURE = '''
import os, sys
import torch, tpu_debug
from tpu_debug.runtime import distributed as dist
from tpu_debug.runtime.distributed import xla_log

dist.init_device_mesh("tpu", (2,), mesh_dim_names=("dp",))
remat = (b"W1204 00:00:00.000000 1 spmd_partitioner.cc:656] [SPMD] Involuntary full rematerialization. "
         b"The compiler cannot go from sharding {devices=[2,1]<=[2]} to {devices=[1,2]<=[2]} efficiently for "
         b"HLO operation %add.2 = f32[2,8]{1,0} add(%a, %b), sharding={devices=[2,1]<=[2]}, "
         b'metadata={op_name="jit(fn)/add_1|aten::add.Tensor/add"}. As the last resort, SPMD will replicate.\\n')
with xla_log.capture():  # no tracer reads the warnings: XLA's line stays where XLA put it
    os.write(2, remat.replace(b"[SPMD]", b"[SPMD unread]"))
print(xla_log.take())
xla_log.add_reader()
print("before", file=sys.stderr, flush=True)
with xla_log.capture():
    os.write(2, b"first line of the compile\\n" + remat + b"last line of the compile\\n")
    print("python inside", file=sys.stderr)
(w,) = xla_log.take()
print(w.instruction, w.shape, w.opcode, w.node, w.aten_op, w.from_sharding, w.to_sharding)
print(xla_log.take())
print("after", file=sys.stderr, flush=True)
'''


def test_the_capture_prints_back_every_line_it_does_not_keep(tmp_path):
    script = tmp_path / "capture.py"
    script.write_text(textwrap.dedent(_CAPTURE))
    proc = run_python([str(script)], devices=2, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [x for x in proc.stderr.splitlines() if x in
             ("before", "first line of the compile", "last line of the compile", "python inside", "after")]
    assert lines == ["before", "first line of the compile", "last line of the compile", "python inside", "after"]
    assert proc.stderr.count("Involuntary") == 1 and "[SPMD unread] Involuntary" in proc.stderr
    assert proc.stdout.splitlines() == [
        "()", "%add.2 f32[2,8] add add_1 aten::add.Tensor {devices=[2,1]<=[2]} {devices=[1,2]<=[2]}", "()"]


def test_parse_line_reads_both_wordings_of_the_warning():
    # the wording of XLA before 2025 (openxla/xla spmd_partitioner.cc), as users' logs show it
    old = parse_line(
        "E0414 spmd_partitioner.cc:621] [spmd] Involuntary full rematerialization. The compiler was not able to "
        "go from sharding {devices=[1,1,2,2]<=[4] last_tile_dim_replicate} to {devices=[2,2]<=[2,2]T(1,0) "
        "last_tile_dim_replicate} without doing a full rematerialization of the tensor for HLO operation: "
        "%pad = f64[96]{0} pad(%broadcast.690, %constant), padding=8_7, sharding={devices=[1,1,2,2]<=[4] "
        "last_tile_dim_replicate}. You probably want to enrich the sharding annotations."
    )
    assert (old.from_sharding, old.to_sharding) == (
        "{devices=[1,1,2,2]<=[4] last_tile_dim_replicate}", "{devices=[2,2]<=[2,2]T(1,0) last_tile_dim_replicate}")
    assert (old.instruction, old.shape, old.opcode, old.node) == ("%pad", "f64[96]", "pad", "")
    # without the instruction (XLA before mid-2024) the shardings still count
    bare = parse_line("[spmd] Involuntary full rematerialization. The compiler was not able to go from sharding "
                      "{devices=[256,1]<=[256]} to {devices=[1,64,4]<=[256] last_tile_dim_replicate} without "
                      "doing a full rematerialization of the tensor.")
    assert bare.to_sharding == "{devices=[1,64,4]<=[256] last_tile_dim_replicate}" and bare.instruction == ""
    assert parse_line("W1204 some other warning {devices=[2]}") is None


def test_a_program_read_back_from_the_compile_cache_keeps_its_finding(tmp_path):
    """XLA compiles nothing for an executable read back from the disk cache, so it logs nothing:
    the second run must still have the finding, from the warnings kept beside the entry."""
    import tpu_debug

    pitfall = REPO / "examples" / "pitfalls" / "sharding_remat.py"
    kinds = []
    for name in ("first", "second"):
        proc = run_python(["-m", "tpu_debug", "run", "--logdir", str(tmp_path / "runs"), "--name", name,
                           "--devices", "8", str(pitfall), "--steps", "2"],
                          TPU_DEBUG_COMPILE_CACHE="1", TPU_DEBUG_COMPILE_CACHE_DIR=str(tmp_path / "cache"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Involuntary full rematerialization" not in proc.stderr
        with tpu_debug.open_run(name, logdir=tmp_path / "runs") as session:
            kinds.append([f.kind for f in session.findings()])
            cached = sum(e.from_cache for e in session.compiles())
    assert kinds == [["sharding_remat"], ["sharding_remat"]]
    assert cached > 0, "the second run compiled its programs again: the cache was not used"

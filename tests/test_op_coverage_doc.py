"""docs/op_coverage.md is what scripts/op_coverage.py generates now.

The document is derived from op_db, the op table and tests/runtime/opinfo_expectations.py;
a lowering or expectation change without regenerating it fails here.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_op_coverage_doc_is_fresh():
    proc = subprocess.run(
        [sys.executable, "scripts/op_coverage.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout

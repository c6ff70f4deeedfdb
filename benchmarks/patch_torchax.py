"""Make torchax 0.0.13 import on torch 2.13: drop its registrations of aten overloads this
torch no longer has (named-tensor ``*.Dimname``/``*.names_*`` overloads, ``index_copy.dimname``).

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 python benchmarks/patch_torchax.py   # in torchax's environment

Each dropped line is one entry of a table or list (``torch.ops.aten.<op>.<overload>,`` or
``...: policy,``) naming an overload ``torch.ops.aten.<op>`` does not have; running it again
changes nothing.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re

import torch

_ENTRY = re.compile(r"^\s*torch\.ops\.aten\.(\w+)\.(\w+)\s*[,:]")


def _missing(op: str, overload: str) -> bool:
    packet = getattr(torch.ops.aten, op, None)
    return packet is None or not hasattr(packet, overload)


def main() -> None:
    root = pathlib.Path(importlib.util.find_spec("torchax").origin).parent
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().splitlines(keepends=True)
        keep = [line for line in lines if not ((m := _ENTRY.match(line)) and _missing(m[1], m[2]))]
        if len(keep) != len(lines):
            path.write_text("".join(keep))
            print(f"{path}: dropped {len(lines) - len(keep)} overloads")


if __name__ == "__main__":
    main()

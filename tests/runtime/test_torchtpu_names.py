"""Every name of TorchTPU's Python surface that code written for it uses (tests/torchtpu_names/
names.txt, each with the file it comes from) resolves here as the list says: to this runtime's
behaviour, or to a stand-in that says in one line it needs a TPU and what to use; and each
names a behaviour test that exists."""

from __future__ import annotations

import ast
import dataclasses
import importlib
from pathlib import Path

import pytest
import torch
from tpu_debug.core.errors import UnsupportedError

NAMES = Path(__file__).parents[1] / "torchtpu_names" / "names.txt"
GROUPS = ("docs", "projects", "tests")


@dataclasses.dataclass(frozen=True)
class Name:
    name: str
    groups: tuple[str, ...]
    sources: tuple[str, ...]
    status: str
    test: str


def read_names(text: str) -> list[Name]:
    """The list's rows (``name | groups | sources | status | test``; ``#`` starts a comment)."""
    rows = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, groups, sources, status, test = (c.strip() for c in line.split(" | "))
        rows.append(Name(name, tuple(groups.split(",")), tuple(s.strip() for s in sources.split(",")), status, test))
    return rows


ROWS = read_names(NAMES.read_text())


def resolve(dotted: str):
    """The object ``dotted`` names: the longest prefix that imports as a module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_list_is_well_formed():
    seen = set()
    for row in ROWS:
        assert row.name not in seen, f"{row.name} listed twice"
        seen.add(row.name)
        assert row.groups and set(row.groups) <= set(GROUPS), row
        assert all(":" in s or s == "issue" for s in row.sources), row
        assert row.status in ("works", "tpu-only") or row.status.startswith("absent: "), row


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_every_name_resolves_as_listed(row: Name):
    torch.tpu  # noqa: B018 (the device registered, as torch's autoload does)
    if row.status.startswith("absent: "):
        with pytest.raises((AttributeError, ModuleNotFoundError), match=row.name.rsplit(".", 1)[-1]):
            resolve(row.name)
        return
    obj = resolve(row.name)
    if row.status == "tpu-only":
        with pytest.raises(UnsupportedError, match=r"needs|no counterpart") as refused:
            obj()
        message = str(refused.value)
        assert "\n" not in message and ("use" in message or "drop" in message or "leave" in message), message


def _tests_in(path: Path) -> set[str]:
    return {node.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_each_name_names_a_behaviour_test_that_exists():
    here = Path(__file__).parent
    missing = []
    for row in ROWS:
        file, _, test = row.test.partition("::")
        if not (here / file).exists() or test not in _tests_in(here / file):
            missing.append(f"{row.name}: {row.test}")
    assert not missing, "behaviour tests the list names that do not exist:\n" + "\n".join(missing)


def test_the_counts_per_group():
    # the list covers each group; names that cannot exist here are few and said why
    for group in GROUPS:
        rows = [r for r in ROWS if group in r.groups]
        assert rows, group
        absent = [r for r in rows if r.status.startswith("absent: ")]
        assert len(absent) <= 3, absent

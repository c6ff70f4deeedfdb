"""Expected ModuleInfo failures on `tpu`, read by ``test_moduleinfo.py``; every entry carries
its reason.

EXPECTATIONS: (module name, "train" | "eval", mode) -> (kind, reason)
    kind "xfail": strict xfail in both tiers.
    kind "xfail_full": the failure shows only beyond the CI tier's first input: strict
        xfail in the full sweep, no mark in CI.
    kind "skip": not run.
    kind "flaky": a non-strict xfail, with the reason the CPU reference does not reproduce.
    The training flag and the mode may be "*".
"""

from __future__ import annotations

EXPECTATIONS: dict[tuple[str, str, str], tuple[str, str]] = {}


def expectation(name: str, training: str, mode: str, *, full: bool) -> tuple[str, str] | None:
    """The (kind, reason) applying to one case, or None; "xfail_full" is None outside the full sweep."""
    for key in ((name, training, mode), (name, training, "*"), (name, "*", mode), (name, "*", "*")):
        entry = EXPECTATIONS.get(key)
        if entry is not None:
            kind, reason = entry
            if kind == "xfail_full":
                return ("xfail", reason) if full else None
            return kind, reason
    return None

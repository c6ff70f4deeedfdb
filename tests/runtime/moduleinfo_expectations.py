"""Expected ModuleInfo failures on `tpu`, read by ``test_moduleinfo.py``; every entry carries
its reason.

EXPECTATIONS: (module name, "train" | "eval", mode) -> (kind, reason)
    kind "xfail": strict xfail in both tiers.
    kind "xfail_full": the failure shows only beyond the CI tier's first input: strict
        xfail in the full sweep, no mark in CI.
    kind "skip": not run.
    kind "flaky": a non-strict xfail, with the reason the CPU reference does not reproduce.
    The training flag and the mode may be "*".

TOLERANCES: module name -> (rtol, atol, reason), replacing assert_close's float32 defaults
    (rtol 1.3e-6, atol 1e-5) for that module, where its sums cancel: the harness already
    accepts a value as close to the float64 result as CPU's, so an entry is for results
    whose rounding is bounded by the size of their terms rather than their own.
"""

from __future__ import annotations

EXPECTATIONS: dict[tuple[str, str, str], tuple[str, str]] = {
    ("nn.FractionalMaxPool3d", "*", "compiled"): (
        "skip", ("the process aborts (C++ terminate, no Python exception) while AOTAutograd traces the "
                 "module's joint forward and backward on tpu fake tensors; the same module compiles on CPU "
                 "(backend aot_eager), and runs eagerly and lazily on tpu: not yet found why, skipped so a "
                 "sweep keeps its process")),
}

TOLERANCES: dict[str, tuple[float, float, str]] = {
    "nn.GRU": (1.3e-6, 3e-5, ("the gradient of a recurrent weight sums, over time steps and layers, products "
               "of gate gradients and inputs of either sign: its float32 rounding is bounded by the terms, of the "
               "size of the largest gradient entry (about 40 in module_db's inputs, 5e-6 a rounding), a few "
               "roundings per step over 3 steps and 2 layers; XLA and CPU order the sums differently")),
}


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


def tolerance(name: str) -> dict[str, float]:
    """assert_close's ``rtol``/``atol`` for one module: its entry's, or the float32 defaults."""
    entry = TOLERANCES.get(name)
    return {} if entry is None else {"rtol": entry[0], "atol": entry[1]}

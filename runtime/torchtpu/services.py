"""TorchTPU names its benchmarks call that reach Google's services or a CUDA host:
``torch_tpu._internal.shims.mlcompass.benchmark_data`` (``BenchmarkData``, the record of one
result), ``.export_lib_borg`` and ``torch_tpu._internal.benchmarks.export_adapter`` (export to
MLCompass, Google's benchmark database) and ``torch_tpu._internal.distributed.gpu_env``
(workers on CUDA devices). The record is data and works; the rest raise one line saying what
to do, and the benchmarks call them only when asked to export (``--mlcompass_tracking_id``)
or run on a GPU platform.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tpu_debug.core.errors import UnsupportedError

__all__ = ["BenchmarkData", "export_benchmark_results", "export_results_to_mlcompass", "run_in_workers"]


@dataclasses.dataclass
class BenchmarkData:
    """One benchmark result as TorchTPU's MLCompass export takes it (the fields its benchmarks set)."""

    test_name: str
    wall_time: float | None = None
    base_cl: str | None = None
    pending_cl: str | None = None
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    mlcompass_tracking_id: str | None = None
    mlcompass_execution_mode: str | None = None
    team_name: str | None = None
    succeeded: bool = True
    mlcompass_run_tags: Sequence[str] | None = None
    micro_result_key: str | None = None


def _elsewhere(qualname: str, needs: str, instead: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise UnsupportedError(f"{qualname} needs {needs}; tpu_debug's runtime has no counterpart: {instead}")

    refuse.__name__ = refuse.__qualname__ = qualname.rsplit(".", 1)[-1]
    refuse.__doc__ = f"Not available here: {instead}"
    return refuse


_MLCOMPASS = ("Google's MLCompass benchmark database", "leave --mlcompass_tracking_id unset (the results are logged)")
export_results_to_mlcompass = _elsewhere("export_lib_borg.export_results_to_mlcompass", *_MLCOMPASS)
export_benchmark_results = _elsewhere("export_adapter.export_benchmark_results", *_MLCOMPASS)
run_in_workers = _elsewhere("gpu_env.run_in_workers", "CUDA devices",
                            "use a TPU platform, whose workers run on the tpu device here")

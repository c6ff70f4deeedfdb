"""``torch_tpu._internal.utils.benchmarking``: a benchmark's figures as TensorBoard scalars.

TorchTPU's training examples (Llama 3, gpt-oss) end by writing their step times through it:
``record_tensorboard_metrics(writer, METRIC_PROFILES["Training/StepTime"], step_times)``
writes each value under ``<name>/Value_<unit>`` (its index the step) and each statistic of
the profile under ``<name>/<stat>_<unit>``; ``assert_metric_within_threshold`` compares one
statistic with a baseline, a percentage allowed either way. Nothing here needs a TPU.
"""

from __future__ import annotations

import enum
import operator
from typing import Any

import numpy as np

__all__ = ["METRIC_PROFILES", "Comparison", "Stat", "assert_metric_within_threshold", "compute_stats",
           "construct_metric_tag", "record_tensorboard_metrics"]


class Stat(enum.Enum):
    """A statistic of a metric; its value is the first part of its tag's last element."""

    MEAN = "Mean"
    MEDIAN = "Median_p50"
    P90 = "P90"
    P95 = "P95"
    P99 = "P99"
    STDDEV = "StdDev"
    VALUE = "Value"  # each raw value, not a statistic


class Comparison(enum.Enum):
    LESS = "LESS"
    GREATER = "GREATER"


_STATS = (Stat.MEAN, Stat.MEDIAN, Stat.P90, Stat.P95, Stat.P99, Stat.STDDEV)
_PERCENTILES = {Stat.P90: 90, Stat.P95: 95, Stat.P99: 99}


def _profiles(*rows: tuple[str, str, tuple[Stat, ...]]) -> dict[str, dict[str, Any]]:
    return {name: {"name": name, "unit": unit, "stats": list(stats)} for name, unit, stats in rows}


#: the metrics TorchTPU's examples and benchmarks report: name -> {"name", "unit", "stats"}
METRIC_PROFILES: dict[str, dict[str, Any]] = _profiles(
    *((f"Compilation/{kind}", "s", _STATS) for kind in (
        "Conv5D", "DepChain", "Randint_Float32_fast", "Randint_Float32_power_of_two", "Randint_Float32_slow",
        "Sort_Float32", "Take_Float32")),
    ("Inference/Latency", "ms", _STATS),
    ("Inference/PreheatLatency", "ms", (Stat.VALUE,)),
    ("Training/PreheatOverhead", "s", _STATS),
    ("Training/StepTime", "s", _STATS),
    ("Training/ValidationLoss", "loss", (Stat.VALUE,)),
)


def compute_stats(metrics: list[float], stats_to_compute: list[Stat]) -> dict[Stat, float]:
    """Each statistic of ``metrics`` asked for (``Stat.VALUE`` is not one: it is left out)."""
    values = np.asarray(metrics, dtype=np.float64)
    out: dict[Stat, float] = {}
    for stat in stats_to_compute:
        if stat is Stat.MEAN:
            out[stat] = float(values.mean())
        elif stat is Stat.MEDIAN:
            out[stat] = float(np.median(values))
        elif stat in _PERCENTILES:
            out[stat] = float(np.percentile(values, _PERCENTILES[stat]))
        elif stat is Stat.STDDEV:
            out[stat] = float(values.std())
    return out


def construct_metric_tag(metric_profile: dict[str, Any], stat: Stat) -> str:
    """``"Inference/Latency"`` in ms, ``Stat.P90`` -> ``"Inference/Latency/P90_ms"``."""
    return f"{metric_profile['name']}/{stat.value}_{metric_profile['unit']}"


def record_tensorboard_metrics(writer: Any, metric_profile: dict[str, Any], metrics: list[float],
                               record_step_metrics: bool = True) -> None:
    """Write ``metrics`` with ``writer`` (a ``torch.utils.tensorboard.SummaryWriter``): each value
    at its index under the profile's ``Value`` tag (``record_step_metrics``), then each of the
    profile's statistics under its own tag."""
    if record_step_metrics:
        tag = construct_metric_tag(metric_profile, Stat.VALUE)
        for step, value in enumerate(metrics):
            writer.add_scalar(tag, value, step)
    for stat, value in compute_stats(metrics, metric_profile.get("stats", [])).items():
        writer.add_scalar(construct_metric_tag(metric_profile, stat), value)


def assert_metric_within_threshold(metrics: list[float], metric_profile: dict[str, Any], stat_to_check: Stat,
                                   baseline: float, threshold_percent: float, comparison: Comparison) -> None:
    """Raise AssertionError unless ``stat_to_check`` of ``metrics`` is below ``baseline`` raised by
    ``threshold_percent`` (``LESS``), or above it lowered by that much (``GREATER``)."""
    value = compute_stats(metrics, [stat_to_check])[stat_to_check]
    factor = 1 + threshold_percent / 100 if comparison is Comparison.LESS else 1 - threshold_percent / 100
    bound = baseline * factor
    holds = operator.lt if comparison is Comparison.LESS else operator.gt
    assert holds(value, bound), (
        f"{metric_profile['name']} ({stat_to_check.name}): {value:.4f} is not {comparison.name} than "
        f"{bound:.4f} (baseline {baseline:.4f}, {threshold_percent}% allowed)"
    )

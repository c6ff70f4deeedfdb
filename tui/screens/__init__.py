"""The TUI's views, one Screen each: overview, recompiles, ops, transfers, divergence,
steps, memory, collectives, HLO, help, and the ranks of a multi-process run."""

from __future__ import annotations

from tpu_debug.tui.screens.base import RunScreen
from tpu_debug.tui.screens.collectives import CollectivesScreen
from tpu_debug.tui.screens.divergence import DivergenceScreen
from tpu_debug.tui.screens.help import HelpScreen
from tpu_debug.tui.screens.hlo import HloDiffScreen, HloScreen
from tpu_debug.tui.screens.memory import MemoryScreen
from tpu_debug.tui.screens.ops import OpsScreen
from tpu_debug.tui.screens.overview import OverviewScreen
from tpu_debug.tui.screens.ranks import RanksScreen
from tpu_debug.tui.screens.recompiles import RecompilesScreen
from tpu_debug.tui.screens.steps import StepsScreen
from tpu_debug.tui.screens.transfers import TransfersScreen

__all__ = [
    "CollectivesScreen",
    "DivergenceScreen",
    "HelpScreen",
    "HloDiffScreen",
    "HloScreen",
    "MemoryScreen",
    "OpsScreen",
    "OverviewScreen",
    "RanksScreen",
    "RecompilesScreen",
    "RunScreen",
    "StepsScreen",
    "TransfersScreen",
]

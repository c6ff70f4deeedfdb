"""``torch_tpu._internal.device_utils.annotations``: TorchTPU's memory-layout hint.

``with LayoutContext(TpuLayout(minor_to_major=[1, 0], tiles=[[16, 128]])):`` asks TorchTPU to
lay out the TPU buffers of host-to-device copies in the block that way. Layouts and tiles
belong to the TPU's memory; this host's XLA platform has no tiled layouts, so the hint is
checked (a :class:`TpuLayout`), said once to change nothing here, and the copies keep the
platform's layout. ``tpu-debug run --target`` shows the layouts the TPU's compiler chooses.
"""

from __future__ import annotations

import dataclasses
import warnings

__all__ = ["LayoutContext", "TpuLayout"]


@dataclasses.dataclass
class TpuLayout:
    """An XLA layout: the minor-to-major order of the dimensions, their tiling (each tile a
    list of sizes), and the element size in bits for sub-byte types."""

    minor_to_major: list[int]
    tiles: list[list[int]] = dataclasses.field(default_factory=list)
    element_size_in_bits: int = 0


class LayoutContext:
    """The layout hint for host-to-device copies in the block (see the module).

    Raises:
        TypeError: ``layout`` is not a :class:`TpuLayout`.
    """

    _said = False

    def __init__(self, layout: TpuLayout) -> None:
        if not isinstance(layout, TpuLayout):
            raise TypeError("layout must be an instance of TpuLayout")
        self._layout = layout

    def __enter__(self) -> None:
        if not LayoutContext._said:
            LayoutContext._said = True
            warnings.warn("LayoutContext: TPU memory layouts do not exist on this host's XLA platform; the hint "
                          "changes nothing here (tpu-debug run --target shows the TPU compiler's layouts)",
                          stacklevel=2)

    def __exit__(self, *exc: object) -> None:
        return None

"""tpu_debug's version, in core so every layer can stamp what it writes (runs, cache entries)."""

__version__ = "0.1.0"

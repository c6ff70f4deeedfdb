"""tpu_debug.core: what every layer of tpu_debug shares, with no dependencies of its own.

Errors a user can see (:mod:`~tpu_debug.core.errors`), the delivery of tracer hooks that
never breaks the traced program (:mod:`~tpu_debug.core.hooks`), argument specs
(:mod:`~tpu_debug.core.argspec`), the one reader of HLO text (:mod:`~tpu_debug.core.hlo_text`)
and the collectives read with it (:mod:`~tpu_debug.core.collectives`), the one declaration of every option
(:mod:`~tpu_debug.core.options`) and how sizes, times and source lines are written
(:mod:`~tpu_debug.core.format`).

Standard library only (``tests/test_architecture.py`` checks it): the runtime, the
tracers, the reading verbs and the package face all import it, and importing it
registers no device and imports neither torch nor jax.
"""

"""``torch_tpu._internal.shims.xprof.xprof_session``, ``.xprof_analysis_client`` and
``torch_tpu._internal.profiler.xprof_adapter``: the profiling sessions of TorchTPU's benchmarks.

``XprofSession().start_session(host_trace_level=3, enable_python_tracer=True)`` starts a JAX
profiler trace; ``end_session_and_get_session_id()`` stops it and returns the session's id, the
name of the run folder JAX wrote (``<log_dir>/plugins/profile/<id>/*.xplane.pb``), and
``end_session_and_get_url()`` returns that folder as a ``file://`` URL, which XProf and
TensorBoard open (TorchTPU returns its XProf service's page). ``xprof_adapter.TraceMe`` is
``traceme.TraceMe``. ``XprofAnalysisClient`` queries Google's XProf service for a session's
analyses; it has no counterpart here and says so when made.
"""

from __future__ import annotations

import os
import pathlib
import tempfile

import jax
from tpu_debug.core.errors import TraceActiveError, UnsupportedError
from tpu_debug.runtime.torchtpu.traceme import TraceMe

__all__ = ["TraceMe", "XprofAnalysisClient", "XprofSession"]


class XprofSession:
    """One profiling session: a JAX profiler trace into ``log_dir`` (a new temporary folder by default)."""

    def __init__(self, log_dir: os.PathLike[str] | str | None = None) -> None:
        self.log_dir = pathlib.Path(log_dir) if log_dir is not None else pathlib.Path(
            tempfile.mkdtemp(prefix="xprof_session_"))
        self._runs_before: set[str] = set()
        self._active = False

    def start_session(self, host_trace_level: int = 2, enable_python_tracer: bool = False,
                      host_cpu_profile: bool = False, device_tracer_level: int = 1) -> None:
        """Start the trace at TorchTPU's tracer levels.

        Args:
            host_trace_level: JAX's host tracer level (3: every TraceMe).
            enable_python_tracer: record Python calls too.
            host_cpu_profile: TorchTPU's sampled host CPU profile; JAX's profiler has none,
                so it is accepted and the trace has the host tracer's spans only.
            device_tracer_level: JAX's device tracer level (0: none).

        Raises:
            TraceActiveError: another JAX trace runs in this process.
        """
        del host_cpu_profile
        options = jax.profiler.ProfileOptions()
        options.host_tracer_level = host_trace_level
        options.python_tracer_level = int(enable_python_tracer)
        options.device_tracer_level = device_tracer_level
        self._runs_before = set(self._runs())
        try:
            jax.profiler.start_trace(str(self.log_dir), profiler_options=options)
        except RuntimeError as exc:  # JAX runs one trace per process
            raise TraceActiveError(f"start_session() cannot start a JAX trace: {exc}. "
                                   "End the other session or trace first") from None
        self._active = True

    def end_session_and_get_session_id(self) -> str:
        """Stop the trace; the session's id (its run folder's name under ``log_dir/plugins/profile``).

        Raises:
            TraceActiveError: no session was started.
        """
        if not self._active:
            raise TraceActiveError("end_session_and_get_session_id(): no session runs; call start_session() first")
        jax.profiler.stop_trace()
        self._active = False
        new = sorted(set(self._runs()) - self._runs_before)
        return new[-1] if new else ""

    def end_session_and_get_url(self) -> str:
        """Stop the trace; its run folder as a ``file://`` URL."""
        session_id = self.end_session_and_get_session_id()
        return (self.log_dir / "plugins" / "profile" / session_id).resolve().as_uri()

    def _runs(self) -> list[str]:
        folder = self.log_dir / "plugins" / "profile"
        return [p.name for p in folder.iterdir()] if folder.is_dir() else []


class XprofAnalysisClient:
    """TorchTPU's client of Google's XProf analysis service (hosts, XSpaces, memory profiles of
    a session); not available here."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise UnsupportedError("XprofAnalysisClient needs Google's XProf service; tpu_debug's runtime has no "
                               "counterpart: use the session's folder (XprofSession.end_session_and_get_url()) "
                               "in XProf or TensorBoard")

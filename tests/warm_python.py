"""``subprocess.run`` for the tests' Python processes, forked from one that has imported torch and jax.

A test that runs a program as a user does (``python -m tpu_debug run script.py``,
``python script.py``) pays about 4.5 CPU seconds importing torch, jax and dynamo before the
program's first line, most of a short program's cost; the suite starts about a hundred such
processes. :func:`run` takes the same command and arguments as ``subprocess.run(...,
capture_output=True, text=True)`` and starts the program in a fork of a *warm* interpreter
(one per test process and environment) that has imported those libraries and nothing else:

- the program is its own process, as under ``subprocess``: its own pid and process group,
  working directory, environment, ``sys.argv``, ``sys.path[0]`` and ``__main__`` module,
  standard streams (files, read back as ``stdout``/``stderr``), exit status (a signal's
  negative number) and interpreter shutdown (exit handlers, thread joins);
- the warm interpreter has initialized no JAX backend and no device before it forks, so the
  program initializes them as a fresh process would, with its own ``XLA_FLAGS``;
- what is read at import time is the command's: a command whose environment differs from a
  warm interpreter's in anything but the variables read at run time (``TPU_DEBUG_*``,
  ``XLA_FLAGS``, the terminal's size; tpu_debug reads no variable at import) gets a warm
  interpreter started with its environment; one that passes interpreter options a fork cannot
  take, or other ``subprocess`` arguments, runs in a fresh interpreter through ``subprocess.run``.

Tests whose subject is the process itself (what starting one imports and costs, signals sent
to it, its pipes) keep ``subprocess``.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["run"]

# variables the programs read only once they run (the options; XLA's flags, read when a backend
# starts; the terminal's size; the name pytest gives the running test): a command may set them
# differently from the warm interpreter
RUN_TIME = ("TPU_DEBUG_", "XLA_FLAGS", "COLUMNS", "LINES", "PYTEST_CURRENT_TEST")
# interpreter options a fork can take: -u (unbuffered streams), -B (no bytecode written)
OPTIONS = ("-u", "-B")
# idle warm interpreters kept per test process, the least recently used closed first: a test
# module keeps one environment, and a warm interpreter holds about half a GiB
MAX_WARM = 2

# The warm interpreter. It imports the libraries, then serves one request at a time on its own
# descriptors (JSON lines): fork, report the child's pid, wait, report its exit status. The
# child returns from serve() and runs the program at the top level, so the program's end is the
# interpreter's own.
SERVER = r'''
import json, os, runpy, sys, types
requests = os.fdopen(os.dup(0), "rb", 0)
replies = os.fdopen(os.dup(1), "wb", 0)
quiet = os.open(os.devnull, os.O_RDWR)
os.dup2(quiet, 0)
os.dup2(quiet, 1)

import jax, jax.numpy, numpy, torch, torch._dynamo, torch._prims_common, torch._refs
import tpu_debug, tpu_debug.cli
from jax._src import xla_bridge

if xla_bridge.backends_are_initialized():
    raise SystemExit("warm_python: importing the libraries initialized a JAX backend")
import gc
gc.collect()
gc.freeze()  # the libraries' objects stay shared with every fork, unwritten by its collector
replies.write(b'{"ready": true}\n')


def serve():
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            requests.close()
            replies.close()
            return request
        replies.write(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    raise SystemExit(0)


request = serve()
os.setpgid(0, 0)
os.chdir(request["cwd"])
os.environ.clear()
os.environ.update(request["env"])
os.dup2(os.open(request["stdout"], os.O_WRONLY), 1)
os.dup2(os.open(request["stderr"], os.O_WRONLY), 2)
os.close(quiet)
if "-u" in request["options"]:
    sys.stdout.reconfigure(write_through=True)
    sys.stderr.reconfigure(write_through=True)
sys.dont_write_bytecode = "-B" in request["options"]
# the program's globals are a __main__ of its own, as the interpreter gives a program
main = types.ModuleType("__main__")
main.__builtins__ = __builtins__
sys.modules["__main__"] = main
how, what, args = request["how"], request["what"], request["args"]
try:
    if how == "module":  # python -m: the working directory first on the path
        sys.argv = ["-m", *args]
        sys.path[0] = os.getcwd()
        runpy._run_module_as_main(what, alter_argv=True)
    elif how == "code":
        sys.argv = ["-c", *args]
        sys.path[0] = ""
        exec(compile(what, "<string>", "exec"), main.__dict__)
    else:  # python file: the file's directory first on the path
        sys.argv = [what, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(what))
        main.__file__ = what
        with open(what, "rb") as source:
            code = compile(source.read(), what, "exec")
        exec(code, main.__dict__)
except SystemExit:
    raise
except BaseException as error:  # as the interpreter reports an uncaught one: the hook, then exit 1
    error.__traceback__ = error.__traceback__.tb_next  # from the program's frame on
    sys.excepthook(type(error), error, error.__traceback__)
    sys.exit(1)
'''


class _Warm:
    """One warm interpreter and the pipe to it."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, bufsize=0,
            cwd=tempfile.gettempdir(),
        )
        try:
            self.ready = self._reply(None).get("ready", False)
        except (RuntimeError, ValueError):  # it could not import the libraries: commands start fresh
            self.ready = False

    def _reply(self, timeout: float | None) -> dict:
        out = self.process.stdout
        assert out is not None
        if timeout is not None and not select.select([out], [], [], max(timeout, 0.0))[0]:
            raise TimeoutError
        line = out.readline()
        if not line:
            raise RuntimeError(f"the warm interpreter ended (exit {self.process.wait()})")
        return json.loads(line)

    def run(self, request: dict, timeout: float | None) -> int:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        self.process.stdin.flush()
        pid = self._reply(None)["pid"]
        try:
            return self._reply(timeout)["status"]
        except TimeoutError:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._reply(None)
            raise

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()  # type: ignore[union-attr]  # its end of input: it exits
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


# idle warm interpreters by environment, the least recently used first; a program running
# holds its interpreter, so threads running programs at once (the corpus scorer's --jobs) each
# get one
_idle: dict[tuple, list[_Warm]] = {}
_lock = threading.Lock()


def _key(env: Mapping[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if not k.startswith(RUN_TIME)))


def _close_all() -> None:
    with _lock:
        warms = [w for pool in _idle.values() for w in pool]
        _idle.clear()
    for warm in warms:
        warm.close()


atexit.register(_close_all)


def _parse(cmd: Sequence[str]) -> tuple[list[str], str, str, list[str]] | None:
    """(interpreter options, how, what, arguments) of ``python [options] (-m mod | -c code | file) args``."""
    if not cmd or os.path.realpath(cmd[0]) != os.path.realpath(sys.executable):
        return None
    options, i = [], 1
    while i < len(cmd) and cmd[i] in OPTIONS:
        options.append(cmd[i])
        i += 1
    if i >= len(cmd):
        return None
    if cmd[i] in ("-m", "-c") and i + 1 < len(cmd):
        return options, "module" if cmd[i] == "-m" else "code", cmd[i + 1], list(cmd[i + 2:])
    if cmd[i].startswith("-"):
        return None
    return options, "file", cmd[i], list(cmd[i + 1:])


def _take(env: dict[str, str]) -> _Warm | None:
    """An idle warm interpreter for ``env`` (a new one if none is idle), or None if it cannot start."""
    with _lock:
        pool = _idle.get(_key(env))
        warm = pool.pop() if pool else None
    if warm is None:
        warm = _Warm({k: v for k, v in env.items() if not k.startswith(RUN_TIME)})
    if warm.ready and warm.process.poll() is None:
        return warm
    warm.close()
    return None


def _give_back(env: dict[str, str], warm: _Warm) -> None:
    """Keep ``warm`` idle for the next program with ``env``; close the least recently used beyond
    MAX_WARM."""
    key, closing = _key(env), []
    with _lock:
        pool = _idle.pop(key, [])
        pool.append(warm)
        _idle[key] = pool  # the most recently used last
        while sum(map(len, _idle.values())) > MAX_WARM:
            oldest = next(iter(_idle))
            closing.append(_idle[oldest].pop(0))
            if not _idle[oldest]:
                del _idle[oldest]
    for old in closing:
        old.close()


def run(cmd: Sequence[str], *, cwd: str | os.PathLike | None = None, env: Mapping[str, str] | None = None,
        timeout: float | None = None, check: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, cwd=..., env=..., timeout=...)``, the
    program started in a fork of a warm interpreter where that cannot change what it does."""
    cmd = [str(c) for c in cmd]
    kwargs.pop("capture_output", None)
    kwargs.pop("text", None)
    parsed = _parse(cmd)
    environ = dict(os.environ if env is None else env)
    warm = _take(environ) if parsed is not None and not kwargs else None
    if warm is None:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout, check=check,
                              **kwargs)
    options, how, what, args = parsed
    with tempfile.TemporaryDirectory(prefix="warm_python_") as streams:
        out, err = Path(streams, "stdout"), Path(streams, "stderr")
        out.touch()
        err.touch()
        request = {"options": options, "how": how, "what": what, "args": args, "env": environ,
                   "cwd": os.path.abspath(cwd if cwd is not None else os.getcwd()), "stdout": str(out),
                   "stderr": str(err)}
        try:
            code = warm.run(request, timeout)
        except TimeoutError:
            raise subprocess.TimeoutExpired(cmd, timeout, out.read_text(errors="replace"),
                                            err.read_text(errors="replace")) from None
        finally:
            _give_back(environ, warm)
        done = subprocess.CompletedProcess(cmd, code, out.read_text(errors="replace"), err.read_text(errors="replace"))
    if check:
        done.check_returncode()
    return done

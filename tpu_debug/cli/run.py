"""Run a Python script (or module) as the python command would, record it, and print its report."""

from __future__ import annotations

import argparse
import builtins
import io
import os
import runpy
import signal
import sys
import traceback
import types
from importlib.machinery import PathFinder, SourceFileLoader
from pathlib import Path

import tpu_debug
from tpu_debug import ranks
from tpu_debug.cli.tui import open_tui
from tpu_debug.trace_config import TraceConfig
from tpu_debug.core.errors import CommandError, TpuDebugError
from tpu_debug.core.options import check_env, env_text, read_env
from tpu_debug.core.options import options as trace_options
from tpu_debug.core.rank_env import torchrun_env
from tpu_debug.core.run_args import prepare_parser, script_of  # noqa: F401 - the verb's parser is run_args'
from tpu_debug.report import print_rank_report
from tpu_debug.runtime import distributed
from tpu_debug.runtime.distributed import LaunchError, launch_ranks
from tpu_debug.runtime.distributed.launch import device_count_flag
from tpu_debug.tracers.location import is_library_file
from tpu_debug.trace_signals import Terminated, without_handler_frame

_OWN_FILES = {os.path.realpath(__file__), os.path.realpath(runpy.__file__)}


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # what Python does with sys.exit("message")
    return 1


def _user_traceback(tb):
    """Drop our own frames (this module, runpy) from the top of a traceback, and the trace's
    signal handler from its end."""
    tb = without_handler_frame(tb)
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not (filename.startswith("<frozen runpy") or os.path.realpath(filename) in _OWN_FILES):
            break
        tb = tb.tb_next
    return tb


# set by run(): print a tpu_debug error's whole traceback (--traceback, TPU_DEBUG_TRACEBACK)
_full_traceback = False


def _print_exception(exc: BaseException) -> None:
    # the default excepthook reads exc.__traceback__, not its tb argument
    tb = _user_traceback(exc.__traceback__)
    exc.with_traceback(tb)
    if isinstance(exc, TpuDebugError) and not _full_traceback and _print_short(exc, tb):
        return
    sys.excepthook(type(exc), exc, tb)


def _print_short(exc: BaseException, tb) -> bool:
    """A tpu_debug error (a guard, a rank check) says what and where in its message: print
    the user's innermost frame and the message, not the dozens of runtime and PyTorch frames
    between them. False when no frame of the traceback is the user's."""
    frames = [f for f in traceback.extract_tb(tb) if not is_library_file(f.filename)]
    if not frames:
        return False
    print("Traceback (the innermost frame of the script; tpu-debug run --traceback shows every frame):",
          file=sys.stderr)
    print("".join(traceback.format_list(frames[-1:])), end="", file=sys.stderr)
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    return True


def _compile_script(target: str) -> types.CodeType | None:
    """The script file's code, compiled before anything starts, so that a script Python
    cannot compile is said at once and records no run; None for a directory or zip."""
    if not os.path.isfile(target):
        return None
    path = os.path.abspath(target)
    with io.open_code(path) as f:
        source = f.read()
    return compile(source, path, "exec", dont_inherit=True)


def _module_sources(name: str, search_path0: str) -> list[str]:
    """The source files ``python -m name`` would compile: each parent package's
    ``__init__.py``, then the module (or a package's ``__main__.py``). Found the way the
    path finder finds them, without importing anything (importing a parent package would
    run the user's code before the run is recorded); empty when a finder other than the
    file system's would load one of them, which then says its own error when it runs."""
    files, path, parts, depth = [], [search_path0, *sys.path[1:]], name.split("."), 0
    while depth < len(parts):
        depth += 1
        spec = PathFinder.find_spec(".".join(parts[:depth]), path)
        if spec is None or not isinstance(spec.loader, SourceFileLoader):
            return []
        files.append(spec.origin)
        path = list(spec.submodule_search_locations or [])
        if depth == len(parts) and path and parts[-1] != "__main__":
            parts.append("__main__")  # a package runs as its __main__ module
    return files


def _compile_module(name: str, search_path0: str) -> None:
    """Compile what ``-m name`` runs, so that a module Python cannot compile is said at
    once and records no run, as a script is (:func:`_compile_script`)."""
    for file in _module_sources(name, search_path0):
        with io.open_code(file) as f:
            compile(f.read(), file, "exec", dont_inherit=True)


def _did_not_start(exc: SyntaxError, argv0: str) -> int:
    """Say, as Python would, why the script cannot be compiled, and that nothing ran."""
    sys.excepthook(type(exc), exc.with_traceback(None), None)
    where = f" ({os.path.basename(exc.filename or argv0)}, line {exc.lineno})" if exc.lineno else ""
    print(
        f"\ntpu-debug run: {argv0} did not start: {type(exc).__name__}: {exc.msg}{where}. "
        "Nothing ran and no run was recorded; fix the script and run it again.",
        file=sys.stderr,
    )
    return 1


def _run_path(target: str, code: types.CodeType | None) -> None:
    """Execute a script file as ``__main__`` the way ``python script.py`` does: ``__file__``
    absolute, ``sys.argv[0]`` untouched (``runpy.run_path`` would rewrite it)."""
    if code is None:  # a directory or zip with __main__.py
        runpy.run_path(target, run_name="__main__")
        return
    path = os.path.abspath(target)
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=path,
        __builtins__=builtins,
        __loader__=SourceFileLoader("__main__", path),
        __spec__=None,
        __cached__=None,
    )
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _execute(target: str, is_module: bool, code: types.CodeType | None) -> tuple[int, str | None]:
    """Run the target as ``__main__``; returns (exit code, error text)."""
    # here: the dry run imports jax, and the CLI imports this module for every verb
    from tpu_debug.runtime.dry_mode import DryRunValueError  # deferred: entry: the runtime loads torch and jax

    try:
        if is_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            _run_path(target, code)
    except Terminated:  # SIGTERM: no traceback, as when SIGTERM kills python
        return 128 + signal.SIGTERM, "SIGTERM"
    except DryRunValueError as exc:  # the dry run's answer ends here: one line, no traceback
        print(f"tpu-debug run --dry-run: {exc}", file=sys.stderr)
        return 0, None
    except SystemExit as exc:
        return _exit_code(exc), None
    except KeyboardInterrupt as exc:
        _print_exception(exc)
        return 130, "KeyboardInterrupt"
    except BaseException as exc:  # noqa: BLE001 - the script's error: print it as Python would, keep the run
        _print_exception(exc)
        # as Python keeps an uncaught exception it printed, for exit handlers (the c10d live
        # check tells the other ranks this one raised, and where)
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
        return 1, f"{type(exc).__name__}: {exc}"
    return 0, None


def run(args: argparse.Namespace) -> int:
    global _full_traceback
    check_env()  # a bad TPU_DEBUG_* variable: one line, before anything starts
    _full_traceback = args.traceback if args.traceback is not None else read_env("run").get("traceback", False)
    target, script_args, argv0, sys_path0, name = script_of(args)
    try:
        if args.module:
            code = _compile_module(target, sys_path0)
        else:
            code = _compile_script(target)
    except SyntaxError as exc:
        return _did_not_start(exc, argv0 if not args.module else f"-m {argv0}")

    if args.nproc is not None:
        return _run_ranks(args, name)
    if args.devices is not None:
        _simulate_devices(args.devices)
    tpu_debug.runtime.start()  # before jax.distributed: it keeps JAX off an absent TPU

    options = _trace_options(args, name)
    group = None
    if distributed.initialize():  # a rank of `tpu-debug run --nproc`: join the others first
        options["name"] = args.name or f"rank{distributed.get_rank()}"
    elif (joined := _torchrun_group(options)) is not None:
        # a torchrun worker: each rank records its own run under the launch's one parent directory
        group, rank = joined
        options["name"] = args.name or f"rank{rank}"
        options["logdir"] = str(group.path)
    recording = tpu_debug.trace(**options)
    return _record(args, recording, (target, code), script_args, argv0, sys_path0, group=group)


def _torchrun_group(options: dict):
    """(the launch's group, this rank) when torchrun started this process, else None."""
    if torchrun_env() is None:
        return None
    config = TraceConfig.from_env().override(**options)
    return ranks.torchrun_group(Path(config.logdir), options["name"], list(getattr(sys, "orig_argv", sys.argv)))


def _trace_options(args: argparse.Namespace, name: str) -> dict:
    options = {o.name: getattr(args, o.name) for o in trace_options("trace") if o.flag}
    options["name"] = name
    if args.target and args.memory is None:  # a target's report needs the memory record
        options["memory"] = True
    return options


def _record(
    args: argparse.Namespace,
    recording,
    script: tuple[str, types.CodeType | None],  # the target and its compiled code
    script_args: list,
    argv0: str,
    sys_path0: str,
    *,
    group=None,  # the torchrun launch's RankGroup this rank records in
) -> int:
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = [argv0, *script_args]
    if sys.path:
        sys.path[0] = sys_path0
    else:
        sys.path.insert(0, sys_path0)
    stopped = False  # by Ctrl-C or SIGTERM while the run was set up or closed
    try:
        with recording as session:
            code, error = _execute(script[0], bool(args.module), script[1])
            session.mark_exit(code, error)
    except (KeyboardInterrupt, Terminated) as exc:
        # Ctrl-C or SIGTERM while the run was set up or closed: the trace held it until the run
        # was complete, then let it through. Leave without the report, as the user asked.
        if recording.session is None:
            raise
        session = recording.session
        code = 128 + (signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.SIGTERM)
        stopped = True
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0
    try:
        sys.stdout.flush()
        tui = args.tui and not stopped and sys.stdout.isatty() and sys.stdin.isatty()
        if args.tui and not stopped and not tui:
            print("tpu-debug run --tui: not a terminal, so here is the report instead", file=sys.stderr)
        if group is not None:
            # every rank of the launch ends here at its own time: one line each, and the ranks
            # are reported together (N reports interleaved on one terminal would be unreadable)
            print(f"\nrun saved in {session.run_dir}; all ranks: tpu-debug report {group.path}", file=sys.stderr)
            return code
        if args.report and not stopped and not tui:
            session.print_summary(file=sys.stderr)
        print(f"\nrun saved in {session.run_dir} (tpu-debug report {session.run_dir})", file=sys.stderr)
        if tui:
            open_tui(session)
    except KeyboardInterrupt:  # Ctrl-C on the report: the run is saved, stop here
        print(f"\nrun saved in {session.run_dir}", file=sys.stderr)
        return 128 + signal.SIGINT
    finally:
        session.close()
    return code


def _simulate_devices(n: int) -> None:
    """Give the CPU backend ``n`` devices (it reads XLA_FLAGS when JAX first uses it)."""
    from jax._src import xla_bridge

    if n < 1:
        raise CommandError(f"--devices {n}: give at least 1 device", exit_code=2)
    if xla_bridge.backends_are_initialized():
        raise CommandError("--devices: JAX started before the option could apply; set XLA_FLAGS instead")
    os.environ["XLA_FLAGS"] = device_count_flag(os.environ.get("XLA_FLAGS", ""), n)


def _run_ranks(args: argparse.Namespace, name: str) -> int:
    """``--nproc N``: start N ranks, each a ``tpu-debug run`` of the script recording its own run
    under one parent directory; then report them together."""
    if args.nproc < 1:
        raise CommandError(f"--nproc {args.nproc}: give at least 1 process", exit_code=2)
    options = _trace_options(args, name)
    config = TraceConfig.from_env().override(**options)
    group = ranks.new_group(config.logdir, name, args.nproc, list(getattr(sys, "orig_argv", sys.argv)))
    # the ranks get the options through the environment, as any child process gets config
    env = dict(os.environ)
    for field, value in config.as_dict().items():
        if field not in ("logdir", "name") and value is not None:
            env[TraceConfig.env_var(field)] = env_text(value)
    what = ["-m", args.module] + ([args.script] if args.script else []) if args.module else [args.script]
    argv = [sys.executable, "-m", "tpu_debug", "run", "--no-report", "--logdir", str(group.path),
            *what, *args.args]
    try:
        codes = launch_ranks(args.nproc, argv, env=env, devices=args.devices)
    except LaunchError as exc:
        group.write(status="failed", error=str(exc))
        raise CommandError(str(exc)) from None
    failed = [c for c in codes if c != 0]
    group.write(status="failed" if failed else "finished", exit_status=codes)
    try:
        if args.report:
            print_rank_report(group, file=sys.stderr)
        print(f"\nruns saved in {group.path} (tpu-debug report {group.path})", file=sys.stderr)
    finally:
        group.close()
    if not failed:
        return 0
    code = failed[0]
    return code if code > 0 else 128 - code

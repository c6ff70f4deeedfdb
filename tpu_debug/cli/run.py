"""Run a Python script (or module) as ``python`` would, record it, and print its report."""

from __future__ import annotations

import argparse
import builtins
import io
import os
import runpy
import signal
import sys
import types
from importlib.machinery import SourceFileLoader
from pathlib import Path

import tpu_debug
from tpu_debug.errors import CommandError
from tpu_debug.tracing import Terminated

_OWN_FILES = {os.path.realpath(__file__), os.path.realpath(runpy.__file__)}


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.usage = "tpu-debug run [options] (script.py | -m module) [args ...]"
    parser.add_argument("--logdir", help="where runs go (default: $TPU_DEBUG_LOGDIR or ./tpu_debug_runs)")
    parser.add_argument("--name", help="run name (default: the script's name)")
    parser.add_argument(
        "--hlo",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="record StableHLO and optimized HLO of every program (default: on)",
    )
    parser.add_argument(
        "--op-events",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one event per eager op execution (default: off; totals per executable)",
    )
    parser.add_argument(
        "--tensorboard",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="capture a JAX profile with tpu_debug's events, and per-step scalars, for TensorBoard "
        "(default: off; open it with 'tpu-debug tensorboard')",
    )
    parser.add_argument(
        "--tensorboard-max-events",
        type=int,
        metavar="N",
        help="stop the profile capture after N spans (default: 100000)",
    )
    # -- recompiles and transfers --
    parser.add_argument(
        "--fail-on-recompile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="stop the script with RecompileError on the first recompile, showing what changed",
    )
    parser.add_argument(
        "--storm-threshold",
        type=int,
        metavar="N",
        help="flag an op or graph recompiled more than N times as a recompile storm (default: 5)",
    )
    parser.add_argument(
        "--transfer-guard",
        choices=("allow", "log", "disallow"),
        help="log or refuse every host<->device transfer (default: allow)",
    )
    parser.add_argument(
        "--transfer-guard-implicit",
        choices=("allow", "log", "disallow"),
        help="log or refuse implicit transfers only: .item(), print, if t:, CPU fallbacks (default: allow)",
    )
    # -- eager mode --
    parser.add_argument(
        "--eager-mode",
        choices=("defer_and_fuse", "defer_never", "defer_never_and_launch_blocking"),
        help="how ops outside compiled graphs run: 'defer_and_fuse' records them and runs fused "
        "programs when a value is needed (TorchTPU's default), 'defer_never' runs them one by one "
        "(default: $TPU_DEBUG_EAGER_MODE or defer_never)",
    )
    # -- divergence against CPU --
    parser.add_argument(
        "--divergence",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also run every op on CPU (and interpret compiled graphs on CPU); report the first op "
        "or graph node whose result leaves tolerance (default: off)",
    )
    parser.add_argument(
        "--numerics",
        choices=("cpu", "tpu"),
        help="'tpu': float32 matmuls and convolutions in bfloat16 passes, as a TPU computes them "
        "(precision from torch.tpu.precision); 'cpu': float32 (default: $TPU_DEBUG_NUMERICS or cpu)",
    )
    parser.add_argument(
        "--tolerances",
        metavar="SPEC",
        help="divergence tolerances, 'float32=1e-4:1e-6,bfloat16=0.05' (rtol[:atol] per dtype) or 'off' "
        "(default: torch.testing's)",
    )
    parser.add_argument(
        "--divergence-sample",
        type=int,
        metavar="N",
        help="compare every N-th node of a compiled graph (default: 1, all)",
    )
    # -- TPU target --
    parser.add_argument(
        "--target",
        metavar="TPU",
        help="also compile every program for this TPU (v5e, v6e-8, v5p-8, v5e:2x4, ...) and report its "
        "memory, cost, padding and roofline beside the local run (needs libtpu: pip install \"tpu-debug[tpu]\")",
    )
    parser.add_argument(
        "--target-wait",
        type=float,
        metavar="SECONDS",
        help="at the end, wait at most this long for target compiles still running (default: 60)",
    )
    parser.add_argument(
        "--compile-cache",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="read programs compiled by earlier runs back from the compile cache and keep new ones there "
        "(default: on, in ~/.cache/tpu_debug/compile; off with $TPU_DEBUG_COMPILE_CACHE=0)",
    )
    parser.add_argument(
        "--memory",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="record the device bytes tensors hold per step, the peak and the lines holding it "
        "(default: off; on with --target or --dry-run)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        default=None,
        help="run with tensors that hold no data: compile every program for --target, execute nothing, "
        "and report the memory (a value read such as .item() stops the script there)",
    )
    parser.add_argument(
        "--no-report",
        dest="report",
        action="store_false",
        help="do not print the report when the script ends",
    )
    parser.add_argument(
        "--tui",
        action="store_true",
        help="open the terminal UI on the run when the script ends (instead of printing the report)",
    )
    # -- devices and processes --
    parser.add_argument(
        "--devices",
        type=int,
        metavar="N",
        help="simulate N CPU devices (per process), for device meshes on a machine without accelerators "
        "(XLA's --xla_force_host_platform_device_count)",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="run the script as N processes (ranks) of one multi-process run on this machine "
        "(jax.distributed); each rank records its own run, under one parent directory",
    )
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script")
    parser.add_argument("script", nargs="?", help="the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # what Python does with sys.exit("message")
    return 1


def _user_traceback(tb):
    """Drop our own frames (this module, runpy) from the top of a traceback."""
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not (filename.startswith("<frozen runpy") or os.path.realpath(filename) in _OWN_FILES):
            break
        tb = tb.tb_next
    return tb


def _print_exception(exc: BaseException) -> None:
    # the default excepthook reads exc.__traceback__, not its tb argument
    tb = _user_traceback(exc.__traceback__)
    exc.with_traceback(tb)
    sys.excepthook(type(exc), exc, tb)


def _run_path(target: str) -> None:
    """Execute a script file as ``__main__`` the way ``python script.py`` does: ``__file__``
    absolute, ``sys.argv[0]`` untouched (``runpy.run_path`` would rewrite it)."""
    if not os.path.isfile(target):  # a directory or zip with __main__.py
        runpy.run_path(target, run_name="__main__")
        return
    path = os.path.abspath(target)
    with io.open_code(path) as f:
        source = f.read()
    code = compile(source, path, "exec", dont_inherit=True)
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


def _execute(target: str, is_module: bool) -> tuple[int, str | None]:
    """Run the target as ``__main__``; returns (exit code, error text)."""
    from tpu_debug.runtime.dryrun import DryRunValueError  # a recording verb: the runtime is loaded

    try:
        if is_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            _run_path(target)
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
        return 1, f"{type(exc).__name__}: {exc}"
    return 0, None


def run(args: argparse.Namespace) -> int:
    if args.module:
        target, script_args = args.module, ([args.script] if args.script else []) + list(args.args)
        argv0 = target
        sys_path0 = os.getcwd()
        name = args.name or target.rsplit(".", 1)[-1]
    else:
        if not args.script:
            raise CommandError("no script given: tpu-debug run [options] script.py [args ...]", exit_code=2)
        path = Path(args.script)
        if not path.exists():
            raise CommandError(
                f"can't open file {str(path.absolute())!r}: no such file. "
                "Pass the path of a Python script: tpu-debug run script.py [args ...]",
                exit_code=2,
            )
        target, script_args, argv0 = args.script, list(args.args), args.script
        sys_path0 = os.path.dirname(os.path.realpath(path))
        name = args.name or path.stem

    if args.nproc is not None:
        return _run_ranks(args, name)
    if args.devices is not None:
        _simulate_devices(args.devices)
    from tpu_debug.runtime import distributed

    if distributed.initialize():  # a rank of `tpu-debug run --nproc`: join the others first
        name = args.name or f"rank{distributed.get_rank()}"
    recording = tpu_debug.trace(**_trace_options(args, name))
    return _record(args, recording, target, script_args, argv0, sys_path0)


def _trace_options(args: argparse.Namespace, name: str) -> dict:
    return dict(
        logdir=args.logdir,
        name=name,
        hlo=args.hlo,
        op_events=args.op_events,
        tensorboard=args.tensorboard,
        tensorboard_max_events=args.tensorboard_max_events,
        fail_on_recompile=args.fail_on_recompile,
        storm_threshold=args.storm_threshold,
        transfer_guard=args.transfer_guard,
        transfer_guard_implicit=args.transfer_guard_implicit,
        divergence=args.divergence,
        numerics=args.numerics,
        tolerances=args.tolerances,
        divergence_sample=args.divergence_sample,
        eager_mode=args.eager_mode,
        target=args.target,
        target_wait=args.target_wait,
        memory=True if args.target and args.memory is None else args.memory,
        dry_run=args.dry_run,
        compile_cache=args.compile_cache,
    )


def _record(args: argparse.Namespace, recording, target: str, script_args: list, argv0: str, sys_path0: str) -> int:
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = [argv0, *script_args]
    if sys.path:
        sys.path[0] = sys_path0
    else:
        sys.path.insert(0, sys_path0)
    stopped = False  # by Ctrl-C or SIGTERM while the run was set up or closed
    try:
        with recording as session:
            code, error = _execute(target, bool(args.module))
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
        if args.report and not stopped and not tui:
            session.print_summary(file=sys.stderr)
        print(f"\nrun saved in {session.run_dir} (tpu-debug report {session.run_dir})", file=sys.stderr)
        if tui:
            from tpu_debug.cli.tui import open_tui

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

    from tpu_debug.runtime.distributed.launch import device_count_flag

    if n < 1:
        raise CommandError(f"--devices {n}: give at least 1 device", exit_code=2)
    if xla_bridge.backends_are_initialized():
        raise CommandError("--devices: JAX started before the option could apply; set XLA_FLAGS instead")
    os.environ["XLA_FLAGS"] = device_count_flag(os.environ.get("XLA_FLAGS", ""), n)


def _env_text(value) -> str:
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


def _run_ranks(args: argparse.Namespace, name: str) -> int:
    """``--nproc N``: start N ranks, each a ``tpu-debug run`` of the script recording its own run
    under one parent directory; then report them together."""
    from tpu_debug import ranks
    from tpu_debug.config import TraceConfig
    from tpu_debug.report import print_rank_report
    from tpu_debug.runtime.distributed import LaunchError, launch_ranks

    if args.nproc < 1:
        raise CommandError(f"--nproc {args.nproc}: give at least 1 process", exit_code=2)
    options = _trace_options(args, name)
    config = TraceConfig.from_env().override(**options)
    group = ranks.new_group(config.logdir, name, args.nproc, list(getattr(sys, "orig_argv", sys.argv)))
    # the ranks get the options through the environment, as any child process gets config
    env = dict(os.environ)
    for field, value in config.as_dict().items():
        if field not in ("logdir", "name") and value is not None:
            env[TraceConfig.env_var(field)] = _env_text(value)
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

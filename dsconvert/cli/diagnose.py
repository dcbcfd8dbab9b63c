"""``dsconvert diagnose``: its parser and its handler."""

from __future__ import annotations

import argparse

from .args import Shared, json_option, positive_int
from .common import stderr_log

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], shared: Shared) -> None:
    p = sub.add_parser(
        "diagnose", help="find why a running training job waits for data (py-spy)",
        usage="dsconvert diagnose (--pid PID | [--wait S] [--keep-running] -- COMMAND ...) [options]",
        description="Sample a running training job and its DataLoader workers with py-spy (wall and "
        "CPU time), classify where the time goes (waiting for batches, JPEG/PNG decode, file reads, "
        "np.load, remote storage, unpickling, augmentation, IPC, model compute), say whether the job "
        "is input-bound and which dsconvert command fixes it. With -- COMMAND, run the command, "
        "sample it after --wait seconds, then stop it (unless --keep-running).",
        parents=[json_option("the report", "dsconvert.diagnose/2"), shared.quiet])
    p.add_argument("--pid", type=positive_int, help="the training process (the one running the loop)")
    p.add_argument("--duration", type=float, default=10.0, metavar="S",
                   help="seconds to sample (default: %(default)s)")
    p.add_argument("--rate", type=positive_int, default=100, metavar="HZ",
                   help="samples per second (default: %(default)s)")
    p.add_argument("--syscalls", type=float, nargs="?", const=5.0, default=None, metavar="S",
                   help="also trace read/openat latency for S seconds (default 5), per process, and the "
                   "block layer where perf may (the job runs slower while traced)")
    p.add_argument("--tracer", choices=("auto", "perf", "strace"), default="auto",
                   help="with --syscalls: perf trace (light), strace, or auto: perf, strace where perf is "
                   "missing or refused (default: %(default)s)")
    p.add_argument("--wait", type=float, default=10.0, metavar="S",
                   help="with COMMAND: seconds to let it reach its training loop first (default: %(default)s)")
    p.add_argument("--keep-running", action="store_true",
                   help="with COMMAND: let it run to its end after the diagnosis instead of stopping it")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND",
                   help="after --: the training command to launch and diagnose")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..diagnose import diagnose, launch, stop
    from ..diagnose.report import render_json, render_text
    from ..errors import OptionError

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if (args.pid is None) == (not command):
        raise OptionError("give either --pid PID or a command after --, not both or neither")
    log = stderr_log(args)
    proc = launch(command, args.wait, log or (lambda msg: None)) if command else None
    try:
        report = diagnose(proc.pid if proc else args.pid, duration=args.duration, rate=args.rate,
                          syscalls=args.syscalls, log=log, tracer=args.tracer)
        print(render_json(report) if args.json else render_text(report), flush=True)
    finally:
        if proc is not None and not args.keep_running:
            stop(proc)
    if proc is not None and args.keep_running:
        return proc.wait()
    return 0

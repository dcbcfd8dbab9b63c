"""The ``dsconvert`` command: parse arguments, call one library function, render its result.

``main(argv) -> int`` is testable without a subprocess. Library errors become one line on
stderr and exit status 1; usage errors exit 2 (argparse); a conversion that finished but
skipped inputs exits 3, so scripts notice.
"""

from __future__ import annotations

import sys
from typing import List, Optional

from .. import __version__
from . import analyze, bench, cache, diagnose, info, shard, upgrade, verify
from .args import Parser, Shared
from .messages import (
    errors_as_messages,
    exit_status,
    message,
    one_line,
    pipe_closed,
    silence,
    tolerant_streams,
)

__all__ = ["main", "build_parser", "COMMANDS"]

# the subcommands in the order --help lists them: each module holds its parser and its handler
COMMANDS = (shard, analyze, bench, diagnose, verify, cache, info, upgrade)


def build_parser() -> Parser:
    parser = Parser(
        prog="dsconvert",
        description="Find and remove the data-loading bottleneck in deep-learning training: "
        "rewrite many small files into shards that a DataLoader reads fast.",
        epilog="Exit status: 0 done, 1 error, 2 usage error, 3 done but some inputs were skipped "
        "(listed in OUT/dsconvert.json), 4 verify found problems.",
    )
    parser.add_argument("--version", action="version", version=f"dsconvert {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    shared = Shared.make()  # arguments that several subcommands share, each defined once (listed first in --help)
    for command in COMMANDS:
        command.add_parser(sub, shared)
    # every subcommand's parser is a Parser too: argparse makes them of the top parser's class
    parser.commands = dict(sub.choices)
    for name, command_parser in parser.commands.items():  # its own name: a command's arguments may use "command"
        command_parser.set_defaults(cli_command=name)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command line ``argv``; return the exit status (see the parser's epilog)."""
    with tolerant_streams():
        try:
            args = build_parser().parse_args(argv)
            with errors_as_messages():
                status = args.func(args)
                sys.stdout.flush()  # here, so that a closed pipe is seen here and not at exit
                return status
        except KeyboardInterrupt:
            print("dsconvert: interrupted; run the same command again to resume", file=sys.stderr)
            return 130
        except BrokenPipeError as exc:
            closed = [s for s in (sys.stdout, sys.stderr) if pipe_closed(s)]
            if closed:  # the reader stopped reading: nothing more to say, and nowhere to say it
                silence(closed)
                return 141  # as a process killed by SIGPIPE, which is what `cat` would do
            print(f"dsconvert: error: {one_line(message(exc))}", file=sys.stderr)
            return 1
        except SystemExit as exc:
            return exit_status(exc.code)

"""The command line as a package: one module per subcommand, its parser beside its handler."""

import argparse
import subprocess
import sys

from dsconvert import cli


def _subparsers(parser):
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_each_subcommand_is_one_module_holding_its_parser_and_handler():
    parsers = _subparsers(cli.build_parser())
    names = [module.__name__.rsplit(".", 1)[-1] for module in cli.COMMANDS]
    assert list(parsers) == names  # --help lists them in the table's order
    for module in cli.COMMANDS:
        name = module.__name__.rsplit(".", 1)[-1]
        assert parsers[name].get_default("func") is module.run, name


def test_the_entry_points_still_run():
    for argv in ([sys.executable, "-m", "dsconvert", "--version"],
                 [sys.executable, "-c", "import sys; from dsconvert.cli import main; sys.exit(main(['--version']))"]):
        run = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and run.stdout.startswith("dsconvert "), (argv, run.stderr[-2000:])

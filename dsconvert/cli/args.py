"""Argument types and the options several subcommands share: each checks one kind of value
and makes a bad one a usage error (exit 2) naming it, not a traceback."""

from __future__ import annotations

import argparse
import difflib
import math
from dataclasses import dataclass
from typing import Any, Dict, List, NoReturn, Optional

from ..codecs import parse_compression, parse_hw
from ..errors import OptionError
from ..plan import parse_size

__all__ = ["Parser", "quality", "compression", "positive_int", "path_arg", "finite", "positive_float", "seconds",
           "byte_size", "byte_limit", "int_list", "option", "quiet_option", "json_option", "storage_options",
           "height_width", "Shared"]


class Parser(argparse.ArgumentParser):
    """dsconvert's parsers: no abbreviated options (``--worker 2`` is an error, not ``--workers
    2``: an abbreviation that works today breaks silently when an option is added), and a usage
    error is the error and one hint line, not the usage first (the line that matters came last,
    below fifteen lines of options)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.commands: Dict[str, Parser] = {}  # a command's parser, by name (filled by build_parser)

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """As argparse's, but options no parser knows are said by the subcommand's parser, whose
        options the hint names (argparse says them in the top parser's name)."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            target = self.commands.get(getattr(parsed, "cli_command", None) or "", self)
            target.error(f"unrecognized arguments: {' '.join(extras)}{guess(extras, target, self)}")
        return parsed


    def error(self, message: str) -> NoReturn:
        """The error, then where the options are: exit status 2, as argparse's."""
        self.exit(2, f"{self.prog}: error: {message}\nsee `{self.prog} --help` for the options\n")


def guess(extras: List[str], *parsers: argparse.ArgumentParser) -> str:
    """' (did you mean --workers?)' for the first unknown option close to one the parsers know."""
    known = [s for p in parsers for a in p._actions for s in a.option_strings if s.startswith("--")]
    for word in extras:
        if word.startswith("--"):
            close = difflib.get_close_matches(word.split("=", 1)[0], known, n=1, cutoff=0.75)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


def quality(text: str) -> int:
    value = positive_int(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"quality must be within 1..100, not {value}")
    return value


def compression(text: str) -> str:
    """``zstd`` or ``zstd:LEVEL``: a usage error naming the form when not."""
    try:
        parse_compression(text)
    except OptionError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("compress must", "expected", 1)) from None
    return text


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def path_arg(text: str) -> str:
    """A path or URL: not empty ('' would silently mean the current folder)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text


def finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):  # float() also takes 'nan' and 'inf'
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A rate: a finite number > 0."""
    value = finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def seconds(text: str) -> float:
    """A time budget: a finite number >= 0."""
    value = finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def byte_limit(text: str) -> int:
    """A byte bound such as 256MiB, or 0 for none: a usage error, not a traceback, when not."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def byte_size(text: str) -> int:
    """A byte count such as 512MB or 1GiB, >= 1 byte: a usage error, not a traceback, when not."""
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return value


def int_list(minimum: int):
    """argparse type for '0,1,2,4': a list of ints >= minimum."""
    def parse(text: str) -> List[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
        if not values or min(values) < minimum:
            raise argparse.ArgumentTypeError(f"expected numbers >= {minimum}, got {text!r}")
        return values
    return parse


def option(*names: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A parent parser holding one argument, for ``add_parser(..., parents=[...])``: an argument
    that several subcommands share is defined once."""
    parent = Parser(add_help=False)
    parent.add_argument(*names, **kwargs)
    return parent


def quiet_option(help: str = "no progress") -> argparse.ArgumentParser:
    return option("-q", "--quiet", action="store_true", help=help)


def json_option(what: str, schema: Optional[str] = None) -> argparse.ArgumentParser:
    """--json, whose help says what it prints and in which schema."""
    return option("--json", action="store_true",
                   help=f"print {what} as JSON" + (f" (schema {schema})" if schema else ""))


def storage_options() -> argparse.ArgumentParser:
    return option("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an fsspec option for URLs (s3://, gs://, ...), repeatable: values are JSON when they "
                   "parse, dotted keys nest, e.g. client_kwargs.endpoint_url=http://127.0.0.1:9000 or anon=true; "
                   "fsspec's config and FSSPEC_<PROTOCOL>_* variables apply first")


def height_width(text: str):
    try:
        return parse_hw(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True)
class Shared:
    """The parent parsers that several subcommands share, each made once per parser."""

    quiet: argparse.ArgumentParser
    storage: argparse.ArgumentParser
    report: argparse.ArgumentParser
    output: argparse.ArgumentParser

    @classmethod
    def make(cls) -> Shared:
        return cls(
            quiet=quiet_option(),
            storage=storage_options(),
            report=option("--report", type=path_arg, metavar="FILE.html",
                          help="also write a self-contained HTML report with plots (pip install 'dsconvert[report]')"),
            output=option("path", type=path_arg, metavar="OUT", help="a dsconvert output folder"),
        )

"""The one entry point of the benchmarks (run from the repository root).

    python -m benchmarks list                       # the suites and the tables they write
    python -m benchmarks SUITE [options]            # one suite; SUITE --help for its options
    python -m benchmarks SUITE --quick              # its tiny run: shows that it works, in seconds
    python -m benchmarks all                        # every table: run one at a time, then render
    python -m benchmarks all --only decode wds_convert
    python -m benchmarks all --render-only          # tables from the JSON already in docs/bench/
    python -m benchmarks all --quick                # every suite tiny, JSON and tables in a scratch folder

Each table of the docs (docs/benchmarks.md, or the pages of docs/benchmarks/) sits between
``<!-- bench_all:NAME begin -->`` and ``<!-- bench_all:NAME end -->``, in whichever page, and is
rewritten from docs/bench/NAME.json, which its suite
writes with the command, date, machine and versions (benchmarks/common.py): medians with the
range over rounds, the exact command above it. Figures on a shared machine move with its load:
the ranges say by how much; compare only within one table. The end-to-end training input
tables need the peers' virtual environments (``--python-ffcv``, ``--python-dali``,
``--python-peers``); without them they are skipped.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple

from benchmarks import SUITES
from benchmarks.common import BENCH, DOCS, MARKER, ROOT, header, marked_pages


def suite(name: str) -> ModuleType:
    return importlib.import_module(f"benchmarks.{name}")


def tables() -> Dict[str, Tuple[str, Dict[str, Any]]]:
    """Every table of the docs: name -> (suite, its entry in the suite's TABLES)."""
    out: Dict[str, Tuple[str, Dict[str, Any]]] = {}
    for name in SUITES:
        for table, spec in getattr(suite(name), "TABLES", {}).items():
            out[table] = (name, spec)
    return out


# --- one suite ------------------------------------------------------------------------------


def run_suite(name: str, argv: List[str]) -> int:
    module = suite(name)
    doc = (module.__doc__ or "").strip()
    p = argparse.ArgumentParser(prog=f"python -m benchmarks {name}", description=doc.split("\n\n")[0],
                                epilog="\n\n".join(doc.split("\n\n")[1:]) or None,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"the suite's tiny run (its options first, yours after): {' '.join(module.QUICK) or '-'}")
    module.add_arguments(p)
    if "--quick" in argv:  # later options win: the tiny sizes first, anything given after them
        argv = list(module.QUICK) + argv
    status = module.run(p.parse_args(argv))
    return int(status or 0)


# --- every table: run, then render ------------------------------------------------------------


def shown(path: str) -> str:
    """A path as the tables and commands show it: from the repository root when inside it."""
    path = os.path.abspath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def run_table(table: str, a: argparse.Namespace, bench_dir: str) -> bool:
    name, spec = tables()[table]
    needs: Optional[Callable[[argparse.Namespace], Any]] = spec.get("needs")
    if not a.quick and needs is not None and not needs(a):
        print(f"{table}: skipped (needs options: see --help)", flush=True)
        return False
    out = os.path.join(bench_dir, f"{table}.json")
    # --quick: the suite's tiny sizes after the table's options, so that they win
    argv = [name, *spec["argv"](a), *(suite(name).QUICK if a.quick else []), "--json", shown(out)]
    print(f"{table}: python -m benchmarks {' '.join(argv)}", flush=True)
    t = time.perf_counter()
    # a fresh process per table; one that fails (a peer or a test extra not installed) leaves its table as it was
    done = subprocess.run([sys.executable, "-m", "benchmarks", *argv], cwd=ROOT).returncode == 0
    print(f"{table}: {time.perf_counter() - t:.0f} s" + ("" if done else ": FAILED, its table is not rewritten"),
          flush=True)
    return done


def render(names: List[str], bench_dir: str = BENCH, docs: str = DOCS) -> List[str]:
    """Rewrite each named table between its markers, in whichever page of ``docs`` holds them;
    the names that have no markers yet."""
    known = tables()
    pages = {path: open(path, encoding="utf-8").read() for path in marked_pages(docs)}
    missing = []
    for name in names:
        path = os.path.join(bench_dir, f"{name}.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            data = json.load(f)
        meta = data.get("meta") or {"command": "(not recorded)"}
        block = header(meta, shown(path)) + "\n" + known[name][1]["render"](data)
        begin, end = f"{MARKER}{name} begin -->", f"{MARKER}{name} end -->"
        pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
        page = next((p for p, text in pages.items() if pattern.search(text)), None)
        if page is None:
            missing.append(name)
            continue
        # a function, not a replacement string: the block's backslashes stay as they are
        new = f"{begin}\n{block}{end}"
        pages[page] = pattern.sub(lambda _, new=new: new, pages[page])
    for path, text in pages.items():
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return missing


README = os.path.join(ROOT, "README.md")


def render_readme(names: List[str], bench_dir: str = BENCH, readme: str = README) -> List[str]:
    """Rewrite the README's tables: a table whose spec has a ``readme`` render goes between
    ``<!-- bench_all:NAME readme begin -->`` and its end marker, from the same JSON; the names
    rewritten."""
    known = tables()
    if not os.path.exists(readme):
        return []
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    done = []
    for name in names:
        spec = known[name][1]
        path = os.path.join(bench_dir, f"{name}.json")
        begin, end = f"{MARKER}{name} readme begin -->", f"{MARKER}{name} readme end -->"
        if "readme" not in spec or not os.path.exists(path) or begin not in text:
            continue
        with open(path) as f:
            new = f"{begin}\n{spec['readme'](json.load(f))}{end}"
        pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
        text = pattern.sub(lambda _, new=new: new, text)
        done.append(name)
    with open(readme, "w", encoding="utf-8") as f:
        f.write(text)
    return done


def run_all(argv: List[str]) -> int:
    known = tables()
    ap = argparse.ArgumentParser(prog="python -m benchmarks all",
                                 description="Run every table's suite, one at a time, then rewrite the tables.")
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help="these tables (or every table of these suites): " + ", ".join(known))
    ap.add_argument("--render-only", action="store_true", help="regenerate the tables from the JSON in docs/bench")
    ap.add_argument("--quick", action="store_true",
                    help="every suite's tiny run; JSON and rendered tables go to --bench-dir, never docs/")
    ap.add_argument("--bench-dir", help="where the JSON goes (default: docs/bench; with --quick a scratch folder)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (some benchmarks take a few more)")
    ap.add_argument("--photos", type=int, default=4000)
    ap.add_argument("--wds", help="resume: a dsconvert wds output to resume in")
    ap.add_argument("--photo-folder", help="resume: an ImageFolder to convert for it (when --wds is not given)")
    ap.add_argument("--python", help="train_input: an interpreter where torchvision imports")
    ap.add_argument("--python-ffcv")
    ap.add_argument("--python-dali")
    ap.add_argument("--python-peers")
    ap.add_argument("--python-litdata", help="wds_reads: an interpreter where litdata was installed with its own "
                    "dependencies (without it, litdata runs in this interpreter)")
    ap.add_argument("--python-mosaic", help="remote_peers: an interpreter where mosaicml-streaming was installed")
    a = ap.parse_args(argv)
    names = []
    for n in a.only or list(known):
        chosen = [t for t, (s, _) in known.items() if n in (t, s)]
        if not chosen:
            ap.error(f"no table or suite {n!r}: {', '.join(known)}")
        names += [t for t in chosen if t not in names]
    bench_dir = a.bench_dir or (tempfile.mkdtemp(prefix="benchmarks-quick-") if a.quick else BENCH)
    os.makedirs(bench_dir, exist_ok=True)
    docs, readme = DOCS, README
    if a.quick or a.bench_dir:  # the docs are rewritten from docs/bench only: copies of their pages
        docs = os.path.join(bench_dir, "docs")
        for page in marked_pages(DOCS):
            copy = os.path.join(docs, os.path.relpath(page, DOCS))
            os.makedirs(os.path.dirname(copy), exist_ok=True)
            shutil.copyfile(page, copy)
        readme = os.path.join(bench_dir, "README.md")
        shutil.copyfile(README, readme)
    failed = []
    if not a.render_only:
        ran = []
        for name in names:
            (ran if run_table(name, a, bench_dir) else failed).append(name)
        names = ran
    missing = render(names, bench_dir, docs)
    in_readme = render_readme(names, bench_dir, readme)
    for name in missing:
        print(f"{name}: no page under {shown(docs)} has <!-- bench_all:{name} begin/end --> markers", file=sys.stderr)
    print(f"tables rewritten under {shown(docs)}: {', '.join(n for n in names if n not in missing) or 'none'}"
          + (f"; in {shown(readme)}: {', '.join(in_readme)}" if in_readme else ""))
    if failed:
        print(f"failed or skipped: {', '.join(failed)}", file=sys.stderr)
    return 1 if a.quick and failed else 0


# --- list, and the dispatch -------------------------------------------------------------------


def list_suites() -> int:
    width = max(map(len, SUITES))
    for name in SUITES:
        try:
            written = ", ".join(getattr(suite(name), "TABLES", {})) or "-"
        except Exception as exc:  # a suite whose imports fail here is still listed
            written = f"(does not import here: {type(exc).__name__}: {exc})"
        print(f"{name:{width}s}  {SUITES[name]}")
        print(f"{'':{width}s}  tables: {written}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        print("suites: " + ", ".join(SUITES))
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "list":
        return list_suites()
    if command == "all":
        return run_all(rest)
    if command not in SUITES:
        print(f"no suite {command!r}; the suites: {', '.join(SUITES)} (and list, all)", file=sys.stderr)
        return 2
    return run_suite(command, rest)


if __name__ == "__main__":
    sys.exit(main())

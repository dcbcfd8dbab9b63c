"""The import graph of dsconvert/: no cycle, and every import points down the layers.

Every module of the package is parsed (nothing is imported or run) and each of its imports of
dsconvert itself becomes an arrow, wherever it stands: at the top of the module or inside a
function (a function-level import ties modules as surely as a top-level one, it only defers
the failure). Only the imports under ``if TYPE_CHECKING:`` are left out: they never run. A
package import (``dsconvert.readers``, ``from . import x`` where x is no module) is an arrow to
the package's ``__init__``. Imports that ``importlib`` makes from a computed name (the format
registry's) are not seen.

``LAYERS`` is the house, from the ground up. A module may import modules of its own layer or of
a lower one, never of a higher one; a new module goes into the layer it belongs to (the test
names a module that has none). Within a layer, the cycle check keeps the arrows one-way.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

PACKAGE = Path(__file__).resolve().parent.parent / "dsconvert"

# Ground to top. A name covers the module of that name and, for a package, every module in it.
LAYERS: List[Tuple[str, List[str]]] = [
    # plain values and helpers that know nothing of the rest: errors, the version, sample keys,
    # the value types every layer passes around, sizes, image geometry, processes, progress
    ("ground", ["errors", "version", "keys", "samples", "scan_table", "packed_samples", "skips", "schedstat", "units",
                "geometry", "processes", "progress",
                "distributed", "gpu", "jpeg_structure"]),
    # optional packages, field codecs and pixel work, orders, monitoring
    ("support", ["optional", "codecs", "resample", "reencode", "transforms", "fused", "shuffle", "cluster",
                 "monitor", "lightning", "demo"]),
    # where bytes live: local files, fsspec locations, locks, byte ranges, verified shard copies
    ("io", ["io"]),
    # an output's manifest: what every other layer records or reads back
    ("manifest", ["manifest"]),
    # shard specs and results, planning samples into shards, output size estimates
    ("plan", ["plan", "sizing"]),
    # each format: how its shards are named, written from the samples it is handed, and read
    ("formats", ["formats"]),
    # writing one output, for every writer: option checks, the output's life cycle (claim, lock,
    # owner journal, finished outputs, stale files, manifest), the executor loop over shard specs
    ("write", ["write"]),
    # the scanner: a source (folders, lists, tars, Parquet, outputs: these through their formats)
    # turned into samples, reading no contents
    ("source", ["source"]),
    # reading the inputs a scan found, for a conversion (and a source read in place)
    ("inputs", ["inputs"]),
    # conversion: scan, plan, read and write each shard, the manifest last
    ("convert", ["convert", "writer"]),
    # the Datasets over outputs, sources and tars, and their cache
    ("readers", ["readers", "data"]),
    # what runs over all of that: verify, bench, analyze, diagnose (and the fix commands they advise)
    ("tools", ["verify", "upgrade", "bench", "analyze", "diagnose", "advice", "html_report"]),
    # the public API (dsconvert/__init__.py)
    ("api", [""]),
    # the command line
    ("cli", ["cli", "__main__"]),
]


def _modules() -> Dict[str, Tuple[Path, bool]]:
    """Dotted name (without the leading ``dsconvert``; "" for the package) -> (file, is a package)."""
    out: Dict[str, Tuple[Path, bool]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_package)
    return out


def _type_checking_only(tree: ast.Module) -> Set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (never run)."""
    skip: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                for stmt in node.body:
                    skip.update(id(n) for n in ast.walk(stmt))
    return skip


def _within(name: str, modules: Dict[str, Tuple[Path, bool]]) -> Optional[str]:
    """The module a dotted name inside dsconvert is (its nearest existing prefix), "" for the
    package; None for a name outside dsconvert."""
    if name != "dsconvert" and not name.startswith("dsconvert."):
        return None
    name = name[len("dsconvert."):] if name != "dsconvert" else ""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def import_graph() -> Dict[str, Dict[str, int]]:
    """module -> {imported module: line of its first import}, dsconvert's own imports only."""
    modules = _modules()
    graph: Dict[str, Dict[str, int]] = {}
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        skip = _type_checking_only(tree)
        package = ".".join(["dsconvert"] + ([module] if module else [])) if is_package else \
            ".".join(["dsconvert"] + module.split(".")[:-1])
        arrows: Dict[str, int] = {}

        def arrow(target: Optional[str], line: int, module: str = module,
                  arrows: Dict[str, int] = arrows) -> None:  # this module's, bound now
            if target is not None and target != module:
                arrows.setdefault(target, line)

        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    arrow(_within(alias.name, modules), node.lineno)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    full = ".".join(base + ([node.module] if node.module else []))
                else:
                    full = node.module or ""
                if _within(full, modules) is None:
                    continue
                for alias in node.names:  # ``from . import x``: the module x if there is one
                    sub = _within(f"{full}.{alias.name}", modules)
                    exact = sub == f"{full}.{alias.name}"[len("dsconvert."):]
                    arrow(sub if exact else _within(full, modules), node.lineno)
        graph[module] = arrows
    return graph


def _shown(module: str) -> str:
    return "dsconvert" + (f".{module}" if module else "")


def find_cycle(graph: Dict[str, Dict[str, int]]) -> Optional[List[str]]:
    """One cycle of the graph as [a, b, ..., a], or None."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, {})):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def layer_of(module: str) -> Optional[int]:
    """The index in LAYERS of the layer that holds ``module`` (its longest matching name)."""
    best: Optional[Tuple[int, int]] = None
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            if module == name or (name and module.startswith(name + ".")):
                if best is None or len(name) > best[1]:
                    best = (index, len(name))
    return None if best is None else best[0]


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph()
    assert "samples" in graph["plan"]  # from .samples import ...
    assert "readers.source" in graph["readers.open"]  # a function-level import
    assert "readers.base" in graph["readers.map"]  # from .base import ... inside a package
    assert "" in graph["cli"]  # from . import __version__: the package's __init__
    assert "manifest" not in graph["io.shard_cache"]  # under if TYPE_CHECKING: never run


def test_no_import_cycle_inside_dsconvert():
    graph = import_graph()
    cycle = find_cycle(graph)
    if cycle:
        steps = [f"{_shown(a)} -> {_shown(b)} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
        raise AssertionError("an import cycle inside dsconvert/:\n  " + "\n  ".join(steps))


def test_every_module_has_a_layer():
    missing = [_shown(m) for m in import_graph() if layer_of(m) is None]
    assert not missing, f"modules in no layer of LAYERS (tests/test_layers.py): {', '.join(missing)}"


def test_no_module_imports_a_higher_layer():
    graph = import_graph()
    upward = []
    for module, arrows in sorted(graph.items()):
        here = layer_of(module)
        for target, line in sorted(arrows.items()):
            there = layer_of(target)
            if here is not None and there is not None and there > here:
                upward.append(f"{_shown(module)} ({LAYERS[here][0]}) imports {_shown(target)} "
                              f"({LAYERS[there][0]}) at line {line}")
    assert not upward, "imports up the layers:\n  " + "\n  ".join(upward)

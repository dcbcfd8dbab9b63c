"""benchmarks/: one entry point, ``python -m benchmarks``, that names every suite and runs one
end to end (measure, write its JSON, render its table) in seconds. No timing is asserted: the
figures are the benchmarks' business."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "benchmarks")
HELPERS = {"__init__", "__main__", "common"}


def benchmarks(*args, **kw):
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=kw.pop("timeout", 120), **kw)


def test_list_names_every_suite_and_every_module_is_one():
    from benchmarks import SUITES

    modules = {name[:-3] for name in os.listdir(PACKAGE) if name.endswith(".py")} - HELPERS
    assert modules == set(SUITES)  # a new module is registered, a registered suite exists
    done = benchmarks("list")
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines() if line and not line[0].isspace()]
    assert listed == list(SUITES)
    assert "does not import here" not in done.stdout  # every suite imports in the test environment


def test_every_suite_has_run_render_and_a_quick_form():
    import importlib

    from benchmarks import SUITES

    for name in SUITES:
        module = importlib.import_module(f"benchmarks.{name}")
        assert callable(module.add_arguments) and callable(module.run), name
        assert isinstance(module.QUICK, list), name
        for table, spec in module.TABLES.items():
            assert callable(spec["render"]) and callable(spec["argv"]), (name, table)


def test_a_suite_runs_end_to_end_and_renders_its_table(tmp_path):
    done = benchmarks("all", "--quick", "--only", "monitor", "--bench-dir", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.load(open(tmp_path / "monitor.json"))
    assert data["meta"]["command"].startswith("python -m benchmarks monitor ")
    # copies of the docs' pages, rewritten there: docs/ itself is not touched
    pages = [open(p, encoding="utf-8").read() for p in (tmp_path / "docs").rglob("*.md")]
    page = next(text for text in pages if "<!-- bench_all:monitor begin -->" in text)
    table = page.split("<!-- bench_all:monitor begin -->")[1].split("<!-- bench_all:monitor end -->")[0]
    assert data["meta"]["command"] in table and "| `monitor.wrap(...)` |" in table


def test_an_unknown_suite_is_refused_with_the_list():
    done = benchmarks("no_such_suite")
    assert done.returncode == 2 and "decode" in done.stderr


def test_the_readme_table_renders_from_the_dropin_json(tmp_path):
    """The README's table of the drop-in is generated (its markers), from the JSON the dropin
    table is, with --render-only into a copy: README.md itself is not touched."""
    import shutil

    shutil.copyfile(os.path.join(ROOT, "docs", "bench", "dropin.json"), tmp_path / "dropin.json")
    before = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    done = benchmarks("all", "--render-only", "--only", "dropin", "--bench-dir", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert open(os.path.join(ROOT, "README.md"), encoding="utf-8").read() == before
    readme = open(tmp_path / "README.md", encoding="utf-8").read()
    table = readme.split("<!-- bench_all:dropin readme begin -->")[1].split("<!-- bench_all:dropin readme end -->")[0]
    data = json.load(open(tmp_path / "dropin.json"))
    fused = data["summary"]["train"]["dsconvert_fused"]
    row = next(line for line in table.splitlines() if line.startswith('| `open_dataset(out, T, decode="fused")`'))
    assert f"| {fused['median']:,.0f} |" in row and f"{fused['vs_ffcv']:.2f}x" in row
    assert data["meta"]["date"] in table

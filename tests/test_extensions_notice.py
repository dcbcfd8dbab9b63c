"""A quiet build is not a silent build: where a C extension did not build, the first use of the
fused path says so in one line, once per process, with the packages that build it; analyze's
and bench's notes say the same. A missing extension is simulated in a child process by making
its import fail (``sys.modules[name] = None``), the extension itself being built here or not."""

import subprocess
import sys
import textwrap

import pytest

from dsconvert import optional
from dsconvert.analyze.verdict import MEMORY, SOURCE, Measurements, decide
from dsconvert.bench import render_text


def _run(missing, body):
    code = textwrap.dedent(f"""
        import sys, warnings
        for name in {list(missing)!r}:
            sys.modules[name] = None  # its import now fails, as where it did not build
        warnings.simplefilter("default")
    """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("missing", [["dsconvert._jpeg_region"], ["dsconvert._resize"],
                                     ["dsconvert._jpeg_region", "dsconvert._resize"]])
def test_first_fused_use_says_which_extension_is_missing_in_one_line(missing):
    run = _run(missing, """
        from dsconvert.fused import fuse
        fuse(None)
        fuse(None)  # a second dataset: said once per process
        print("fused")
    """)
    assert run.returncode == 0 and run.stdout == "fused\n", run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    line = lines[0]
    assert "MissingExtensionWarning" in line
    assert f"{'are' if len(missing) > 1 else 'is'} not built here" in line
    for name in missing:
        assert name in line
    for name in set(optional.EXTENSIONS) - set(missing):
        assert name not in line
    assert optional.BUILD_PACKAGES in line and "libjpeg-dev" in line and "pip install" in line


def test_nothing_is_said_where_the_extensions_load():
    run = _run([], """
        from dsconvert import optional
        from dsconvert.fused import fuse
        fuse(None)
        print(optional.missing_extensions())
    """)
    assert run.returncode == 0, run.stderr
    missing = eval(run.stdout)  # what is not built on this machine
    assert (run.stderr.strip() == "") == (missing == []), run.stderr


def test_the_warning_is_a_python_warning_a_caller_can_filter():
    run = _run(["dsconvert._resize"], """
        import warnings
        from dsconvert.errors import MissingExtensionWarning
        warnings.simplefilter("error", MissingExtensionWarning)
        from dsconvert.fused import fuse
        try:
            fuse(None)
        except MissingExtensionWarning as w:
            print("raised:", "dsconvert._resize" in str(w))
    """)
    assert run.stdout.strip() == "raised: True", run.stderr


def test_bench_and_analyze_notes_name_the_missing_extensions():
    note = optional.extension_notice(["dsconvert._jpeg_region"])
    report = {"settings": {"transform": "eval", "size": 224, "decode": "fused", "max_samples": 10, "cpus": 2},
              "datasets": [{"path": "/d", "label": "d (source)"}],
              "runs": [{"dataset": "/d", "workers": 0, "batch_size": 8, "cache": "warm", "samples_per_s": 10.0,
                        "mb_per_s": 1.0, "startup_s": 0.1, "wait_ms": {"p50": 1.0, "p99": 2.0},
                        "worker_cpu_pct": None, "main_cpu_pct": 90.0, "vs_first": 1.0}],
              "seconds": 1.0, "notes": [note]}
    assert render_text(report).splitlines()[-1] == f"note: {note}"
    m = Measurements(source="/data/train", storage_kind="local-disk", num_samples=10_000, files_per_sample=1,
                     mean_sample_bytes=110_000, mean_file_bytes=110_000, cold_latency_ms=0.2, fixed_ms=0.1,
                     bandwidth_mb_s=2000, sweep=[(1, 5000), (8, 20000)],
                     loader={SOURCE: {"cold": 400, "warm": 400, "bytes_per_sample": 110_000},
                             MEMORY: {"cold": 420, "warm": 420},
                             "decode=fused": {"cold": 450, "warm": 450, "same_data": True, "decode": "fused"}},
                     decode_ms={"pil": 8.0}, transform_ms=1.0, cores=4, output_dir="/data", region_decoder=False)
    notes = decide(m).notes  # fused measured, not recommended (1.1x): still said
    assert any("region decoder, which is not built here" in n and optional.BUILD_PACKAGES in n for n in notes), notes

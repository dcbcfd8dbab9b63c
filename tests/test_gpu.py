"""GPU utilisation sampling (dsconvert.gpu): parsing and alignment as pure functions, the
nvidia-smi path through a real fake ``nvidia-smi`` executable placed first on PATH, the path
without any GPU, and DataLoadingMonitor(gpu=True) lining idle samples up with its waits."""

import os
import sys
import time

import pytest

from dsconvert import DataLoadingMonitor
from dsconvert.gpu import GpuSampler, align_with_waits, parse_csv_pairs, parse_smi_line, utilisation

from conftest import write_fake_nvidia_smi


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    """A directory holding an executable nvidia-smi (and nothing else), first on PATH; NVML is
    made unimportable so the nvidia-smi path is the one taken even where nvidia-ml-py is installed."""
    bin_dir = write_fake_nvidia_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    return bin_dir


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail("timed out waiting for the fake nvidia-smi's samples")
        time.sleep(0.02)


def test_parse_smi_lines_and_pairs():
    assert parse_smi_line("0, 35, 1024\n") == (0, 35.0, 1024.0)
    assert parse_smi_line("3, 100, 81559") == (3, 100.0, 81559.0)
    for junk in ("index, utilization.gpu [%], memory.used [MiB]", "0, [N/A], 1024", "No devices were found", ""):
        assert parse_smi_line(junk) is None
    assert parse_csv_pairs("4242, GPU-aaaa\n\nNo running processes found\n17, GPU-bbbb\n") == [
        ("4242", "GPU-aaaa"), ("17", "GPU-bbbb")]


def test_utilisation_and_alignment_arithmetic():
    samples = [(0.0, 0, 0.0, 10.0), (0.0, 1, 50.0, 5.0), (1.0, 0, 5.0, 12.0), (2.0, 0, 90.0, 11.0),
               (3.0, 0, 9.9, 10.0)]
    u = utilisation(samples)
    assert u[0] == {"samples": 4, "mean_util": pytest.approx((0 + 5 + 90 + 9.9) / 4), "low_share": 0.75,
                    "max_memory_mib": 12.0}
    assert u[1] == {"samples": 1, "mean_util": 50.0, "low_share": 0.0, "max_memory_mib": 5.0}
    # low samples at t = 0, 1, 3 (and 10 s of span); waits [0.5, 1.5] and [2.5, 3.0] overlap-merged with [2.8, 2.9]
    times, utils = [0, 1, 2, 3, 10], [0, 5, 90, 9.9, 50]
    a = align_with_waits(times, utils, [(0.5, 1.5), (2.5, 3.0), (2.8, 2.9), (4.0, 4.0)])
    assert a == {"low_samples": 3, "low_in_wait": 2, "low_in_wait_share": pytest.approx(2 / 3),
                 "wait_time_share": pytest.approx(1.5 / 10)}
    # a wait running past the sampled span counts only inside it
    assert align_with_waits([1, 2], [0, 0], [(1.5, 9)])["wait_time_share"] == pytest.approx(0.5)
    assert align_with_waits([1, 2], [50, 50], [])["low_in_wait_share"] is None


def test_without_any_gpu_the_sampler_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML
    with GpuSampler(interval=0.05, pids=[os.getpid()]) as g:
        time.sleep(0.1)
    s = g.summary()
    assert s["available"] is False and s["gpus"] == {} and s["job_gpus"] == []
    assert s["reason"] == "no NVIDIA GPU: nvidia-ml-py is not installed; nvidia-smi is not on PATH"


def test_nvidia_smi_without_a_device(fake_smi, monkeypatch):
    monkeypatch.setenv("FAKE_SMI_FAIL", "No devices were found")
    g = GpuSampler(interval=0.05).start()
    g.stop()  # at once: what nvidia-smi said is still read
    s = g.summary()
    assert s["available"] is False and s["backend"] == "nvidia-smi"
    assert s["reason"] == "no NVIDIA GPU: nvidia-smi: No devices were found"


def test_nvidia_smi_samples_are_read_line_by_line(fake_smi, monkeypatch):
    monkeypatch.setenv("FAKE_SMI_PATTERN", "0,0,0,80")  # GPU 0: idle three samples in four
    monkeypatch.setenv("FAKE_SMI_COUNT", "8")
    monkeypatch.setenv("FAKE_SMI_APPS", f"{os.getpid()}, GPU-bbbb-1111;999999, GPU-aaaa-0000")
    g = GpuSampler(interval=0.02, pids=[os.getpid()]).start()
    wait_for(lambda: len(g.samples) == 16)  # then the fake falls silent, as a stalled nvidia-smi would
    g.stop()
    s = g.summary()
    assert s["available"] and s["backend"] == "nvidia-smi"
    assert s["job_gpus"] == [1] and s["job_gpus_found"]  # this process on GPU-bbbb, which is index 1
    assert s["gpus"][0] == {"samples": 8, "mean_util": 20.0, "low_share": 0.75, "max_memory_mib": 1007.0}
    assert s["gpus"][1]["mean_util"] == 50.0 and s["gpus"][1]["low_share"] == 0.0
    times = [t for t, i, _, _ in g.samples if i == 0]
    assert times == sorted(times)  # stamped in the order read


@pytest.mark.slow
def test_monitor_lines_idle_gpu_samples_up_with_its_waits(fake_smi, tmp_path, monkeypatch):
    """The fake GPU idles exactly while the loop waits for its batch (the loader writes "wait"
    to the state file before making the loop wait, "compute" before handing the batch over):
    the monitor must find the idle samples inside its waits far more often than chance."""
    state = tmp_path / "state"
    state.write_text("compute")
    monkeypatch.setenv("FAKE_SMI_STATE", str(state))

    def loader(steps):
        for i in range(steps):
            state.write_text("wait")
            time.sleep(0.25)  # the batch is late: the GPU starves
            state.write_text("compute")
            yield i

    with DataLoadingMonitor(warmup=0, patience=2, gpu=GpuSampler(interval=0.02, pids=[999999])) as monitor:
        for _ in monitor.wrap(loader(6)):
            time.sleep(0.25)  # the "training step": the GPU busy
    s = monitor.summary()
    gpu = s["gpu"]
    assert gpu["available"] and gpu["job_gpus_found"] is False and gpu["job_gpus"] == [0, 1]
    g0 = gpu["gpus"][0]
    assert 0.2 < g0["low_share"] < 0.8 and 0.2 < g0["wait_time_share"] < 0.8
    assert g0["low_in_wait_share"] > 0.8 > g0["wait_time_share"]
    assert gpu["gpus"][1]["low_samples"] == 0 and gpu["gpus"][1]["low_in_wait_share"] is None
    assert "gpu" not in monitor.summary(gpu=False)


def test_monitor_gpu_true_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monitor = DataLoadingMonitor(warmup=0, gpu=True)
    assert list(monitor.wrap(range(3))) == [0, 1, 2]
    monitor.close()
    s = monitor.summary()
    assert s["steps"] == 3 and s["gpu"]["available"] is False and "no NVIDIA GPU" in s["gpu"]["reason"]
    assert monitor.describe().startswith("load p50")


def test_nvml_installed_without_a_driver_falls_back_to_nvidia_smi(fake_smi, monkeypatch):
    """nvidia-ml-py imports, but the NVML library (the driver's libnvidia-ml.so) is not there:
    the sampler says why and reads nvidia-smi instead."""
    monkeypatch.delitem(sys.modules, "pynvml")
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (pip install 'dsconvert[gpu]')")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        why = str(exc)
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this machine: it has an NVIDIA driver")
    monkeypatch.setenv("FAKE_SMI_COUNT", "2")
    g = GpuSampler(interval=0.02).start()
    assert g.used == "nvidia-smi"
    wait_for(lambda: len(g.samples) == 4)
    g.stop()
    assert g.summary()["available"]
    monkeypatch.setenv("FAKE_SMI_FAIL", "No devices were found")
    g = GpuSampler(interval=0.02).start()
    g.stop()
    assert g.summary()["reason"] == "no NVIDIA GPU: nvidia-smi: No devices were found"
    g = GpuSampler(interval=0.02, backend="nvml").start()
    assert g.summary()["reason"] == f"no NVIDIA GPU: NVML: {why}"

"""HTML reports: self-contained, carrying the measured numbers, and rendered by a real
headless Chromium without console errors or network requests."""

import html
import json
import re
import shutil
import sys
import time

import pytest

from dsconvert import (
    MissingDependencyError,
    html_report,  # matplotlib is imported when a figure is drawn, not here
)
from dsconvert.cli import main
from dsconvert.html_report import _fmt, numbers_in

from conftest import make_image_folder


@pytest.fixture(scope="module")
def matplotlib():
    """For the reports' figures: the test of the message given without it runs either way."""
    return pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install 'dsconvert[report]')")


@pytest.fixture(scope="module")
def src(tmp_path_factory, photos):
    root = str(tmp_path_factory.mktemp("report") / "photos")
    make_image_folder(root, photos, {"a": 12, "b": 12, "c": 12}, size=(160, 120))
    return root


@pytest.fixture(scope="module")
def analyzed(src, tmp_path_factory, matplotlib):
    out = tmp_path_factory.mktemp("analyzed")
    page = str(out / "analyze.html")
    report_json = str(out / "analyze.json")
    with open(report_json, "w") as f:
        sys.stdout, saved = f, sys.stdout
        try:
            assert main(["analyze", src, "--sample", "30", "--json", "--report", page, "--output-dir", str(out)]) == 0
        finally:
            sys.stdout = saved
    return json.load(open(report_json)), open(page, encoding="utf-8").read(), page


def assert_self_contained(page):
    refs = re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', page)
    assert all(r.startswith(("#", "data:")) for r in refs), [r for r in refs if not r.startswith(("#", "data:"))]
    assert "url(http" not in page and "@import" not in page and "<link" not in page
    assert "<script src" not in page


@pytest.mark.slow
def test_analyze_report_carries_the_measurements(analyzed):
    report, page, _ = analyzed
    assert_self_contained(page)
    assert page.count("<svg") >= 6
    v = report["verdict"]
    texts = numbers_in(page)
    assert html.escape(v["summary"]) in page
    assert all(f"<code>{html.escape(c)}</code>" in page for c in v["commands"] + v["alternative"])
    for option, rate in v["predicted_per_s"].items():  # the formats figure
        assert f"{_fmt(rate)}/s" in texts, option
    assert f"{_fmt(v['loader_per_s'])}/s" in texts
    rd = report["read"]
    for key, name in (("cold_sequential", "cold"), ("warm", "warm")):  # p50/p99 marked on the ECDFs
        for q in ("p50", "p99"):
            assert f"{name} {q} {_fmt(rd[key]['latency_ms'][q], ' ms')}" in texts
    for r in report["sweep"]:  # the concurrency sweep's points
        assert _fmt(r["files_per_s"]) in texts
    for libs in report["decode"]["per_codec"].values():
        for c in libs.values():
            assert any(t.startswith(_fmt(c["ms"], " ms")) for t in texts)
    pw = v["per_worker_ms"]
    assert f"decode {_fmt(pw['decode'], ' ms')}" in texts and f"read {_fmt(pw['read'], ' ms')}" in texts
    assert any(t.startswith("free: ") for t in texts)  # the disk-budget line
    # the sweep and the fix in the same words as the text report, made from the numbers shown
    from dsconvert.analyze import sentences
    from dsconvert.analyze.report import render_text

    text = render_text(report, tty=False)
    sweep = [(r["readers"], r["files_per_s"]) for r in report["sweep"]]
    said = [sentences.concurrency(sweep), sentences.concurrency_reading(sweep)]
    said += [e for e in v["evidence"]] + ([sentences.fastest(v)] if v["recommended"] else [])
    for sentence in said:
        assert html.escape(sentence) in page and sentence in text, sentence


@pytest.fixture(scope="module")
def benched(src, tmp_path_factory, matplotlib):
    pytest.importorskip("torch")
    from dsconvert import convert

    out = tmp_path_factory.mktemp("benched")
    wds = str(out / "wds")
    convert(src, wds, samples_per_shard=10, workers=1)
    page = str(out / "bench.html")
    report_json = str(out / "bench.json")
    with open(report_json, "w") as f:
        sys.stdout, saved = f, sys.stdout
        try:
            assert main(["bench", src, wds, "--workers", "0,1", "--max-samples", "24", "--batch-size", "8",
                         "--size", "32", "--json", "--report", page]) == 0
        finally:
            sys.stdout = saved
    return json.load(open(report_json)), open(page, encoding="utf-8").read(), page


@pytest.mark.slow
def test_bench_report_has_one_line_per_dataset(benched):
    report, page, _ = benched
    assert_self_contained(page)
    texts = numbers_in(page)
    for r in report["runs"]:
        assert _fmt(r["samples_per_s"]) in texts
    for d in report["datasets"]:
        assert d["label"] in texts  # the legend names each line
    assert "cold page cache" in texts and "warm page cache" in texts


@pytest.mark.slow
def test_without_matplotlib_the_message_says_what_to_install(monkeypatch, tmp_path, capsys, src):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where it is not installed
    assert main(["analyze", src, "--sample", "5", "--json", "-q"]) == 0  # the JSON report needs no matplotlib
    report = json.loads(capsys.readouterr().out)
    with pytest.raises(MissingDependencyError, match=r"pip install 'dsconvert\[report\]'"):
        html_report.analyze_html(report)
    # refused before measuring, not after: without -q a measuring run says each step on stderr
    # ("inventory of ...", "reading 5 sampled files ..."); here the refusal is all there is
    assert main(["analyze", src, "--sample", "5", "--report", str(tmp_path / "r.html")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "pip install 'dsconvert[report]'" in err


# --- a real browser ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium(tmp_path_factory):
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chrome or not driver:
        pytest.skip("Chromium is not installed (apt-get install -y chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--no-first-run", "--disable-component-update", "--disable-sync", "--window-size=1200,1600",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    browser = webdriver.Chrome(service=Service(driver), options=opts)
    try:
        yield browser
    finally:
        browser.quit()


def load(browser, path):
    """Open a page; return (console entries, URLs the page requested)."""
    browser.get("about:blank")  # away from the browser's own start page, which loads its resources
    browser.get_log("browser")
    browser.get_log("performance")
    url = "file://" + path
    browser.get(url)
    deadline = time.time() + 10
    while browser.execute_script("return document.readyState") != "complete" and time.time() < deadline:
        time.sleep(0.05)
    for button in browser.find_elements("css selector", "button[data-copy]")[:1]:
        button.click()  # the copy script runs without errors
    time.sleep(0.3)
    requests = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent" and message["params"].get("documentURL") == url:
            requests.append(message["params"]["request"]["url"])
    return browser.get_log("browser"), requests


@pytest.mark.system
@pytest.mark.parametrize("which", ["analyzed", "benched"])
def test_reports_render_in_chromium_offline(request, chromium, which, tmp_path):
    report, page, path = request.getfixturevalue(which)
    console, requests = load(chromium, path)
    assert [e for e in console if e["level"] in ("SEVERE", "WARNING")] == [], console
    assert requests and all(u.startswith(("file://", "data:")) for u in requests), requests
    height = chromium.execute_script("return document.body.scrollHeight")
    chromium.set_window_size(1200, min(height + 50, 6000))
    shot = tmp_path / f"{which}.png"
    assert chromium.save_screenshot(str(shot)) and shot.stat().st_size > 20_000
    from PIL import Image

    with Image.open(shot) as img:
        assert img.size[0] >= 1000 and len(set(img.convert("L").resize((64, 64)).tobytes())) > 20  # not blank
    text = chromium.execute_script("return document.body.textContent")
    if which == "analyzed":
        assert report["verdict"]["summary"] in text
        assert f"{_fmt(report['verdict']['loader_per_s'])}/s" in text
    else:
        best = max(report["runs"], key=lambda r: r["samples_per_s"])
        assert f"{_fmt(best['samples_per_s'])} samples/s" in text
    svgs = chromium.find_elements("css selector", "figure svg")
    assert len(svgs) >= (6 if which == "analyzed" else 1) and all(s.size["width"] > 300 for s in svgs)

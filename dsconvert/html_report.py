"""Reports people look at: one self-contained HTML file for ``analyze`` and ``bench``.

Everything is inline: the CSS, the figures (SVG from matplotlib's SVG backend, with text kept
as ``<text>`` so the measured numbers are selectable and searchable), and a few lines of script
for the copy buttons. Nothing is fetched over the network, so the file can be mailed, attached
to a ticket or opened offline. The page starts with what to do (the verdict and the exact
commands), then shows the measurements behind it.

matplotlib is an optional dependency (``pip install 'dsconvert[report]'``).
"""

from __future__ import annotations

import html
import io
import math
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .analyze import sentences as say
from .optional import require
from .sizing import format_size
from .version import __version__

__all__ = ["analyze_html", "bench_html", "write", "numbers_in"]

COLOURS = {"cold": "#c0392b", "random": "#e67e22", "warm": "#2471a3", "source": "#7f8c8d",
           "bar": "#2471a3", "read": "#c0392b", "overhead": "#e67e22", "decode": "#2471a3",
           "nofit": "#d5d8dc", "line": "#17202a"}
SERIES = ["#2471a3", "#c0392b", "#27ae60", "#8e44ad", "#e67e22", "#16a085", "#7f8c8d"]

CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#17202a;margin:0;background:#f4f6f7}
main{max-width:1100px;margin:0 auto;padding:24px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:19px;margin:28px 0 8px}h3{font-size:15px;margin:16px 0 6px}
.src{color:#566573;margin:0 0 16px;font-family:ui-monospace,monospace}
section{background:#fff;border-radius:8px;padding:16px 20px;margin:16px 0;box-shadow:0 1px 2px rgba(0,0,0,.08)}
.verdict{border-left:6px solid #c0392b}.verdict.ok{border-left-color:#27ae60}
.summary{font-size:18px;font-weight:600;margin:0 0 8px}
.cmd{display:flex;gap:8px;align-items:flex-start;margin:6px 0}
.cmd pre{flex:1;margin:0;background:#17202a;color:#f4f6f7;padding:8px 12px;border-radius:6px;overflow-x:auto}
.cmd button{padding:6px 12px;border:1px solid #aab7b8;border-radius:6px;background:#fff;cursor:pointer}
.notes li{color:#566573}
figure{margin:8px 0}figure svg{max-width:100%;height:auto}
figcaption,.caption{color:#566573;font-size:14px}
table{border-collapse:collapse;margin:8px 0;font-size:14px}
th,td{padding:4px 10px;border-bottom:1px solid #e5e8e8;text-align:right}th:first-child,td:first-child{text-align:left}
footer{color:#85929e;font-size:13px;margin:24px 0}
"""

SCRIPT = """
document.querySelectorAll('button[data-copy]').forEach(function (b) {
  b.addEventListener('click', function () {
    var text = b.parentElement.querySelector('code').textContent;
    var done = function () { b.textContent = 'Copied'; setTimeout(function () { b.textContent = 'Copy'; }, 1500); };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () {});
    } else {
      var r = document.createRange(); r.selectNodeContents(b.parentElement.querySelector('code'));
      var s = window.getSelection(); s.removeAllRanges(); s.addRange(r); done();
    }
  });
});
"""


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]  # drop the XML prolog and doctype: the SVG is inline


def _figure(draw: Callable[[Any], None], width: float = 7.5, height: float = 3.2) -> str:
    """An SVG figure from matplotlib's Figure API (no pyplot state): text kept as text, ids
    seeded, no date, so the same report gives the same page."""
    matplotlib = require("matplotlib", "the HTML report")
    from matplotlib.figure import Figure

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dsconvert", "font.size": 9,
                                "axes.spines.top": False, "axes.spines.right": False}):
        fig = Figure(figsize=(width, height))
        draw(fig)
        return _svg(fig)


def _esc(text: Any) -> str:
    return html.escape(str(text))


def _page(title: str, subtitle: str, body: List[str], footer: str) -> str:
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_esc(title)}</title><style>{CSS}</style></head><body><main>"
            f"<h1>{_esc(title)}</h1><p class=\"src\">{_esc(subtitle)}</p>"
            + "".join(body) + f"<footer>{footer}</footer></main><script>{SCRIPT}</script></body></html>\n")


def _commands(commands: Sequence[str]) -> str:
    return "".join(f"<div class=\"cmd\"><pre><code>{_esc(c)}</code></pre>"
                   "<button type=\"button\" data-copy>Copy</button></div>" for c in commands)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_esc(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(v: Optional[float], unit: str = "") -> str:
    if v is None:  # a figure the measurement could not determine (a fit over files of one size)
        return "not determined"
    if v >= 100:
        text = f"{v:,.0f}"
    elif v >= 10:
        text = f"{v:.1f}"
    elif v >= 1:
        text = f"{v:.2f}"
    else:
        text = f"{v:.3f}"
    return f"{text}{unit}"


# --- analyze ---------------------------------------------------------------------------------


def _latency_figure(report: Dict[str, Any]) -> str:
    rd = report["read"]
    passes = [("cold, sequential", "cold_sequential", COLOURS["cold"]),
              ("cold, random", "cold_random", COLOURS["random"]), ("warm", "warm", COLOURS["warm"])]

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        for label, key, colour in passes:
            lat = sorted(v for v in rd[key].get("latencies_ms", []) if v > 0)
            if not lat:
                continue
            ys = [(i + 1) / len(lat) for i in range(len(lat))]
            ax.step(lat, ys, where="post", color=colour, label=label, linewidth=1.5)
        for key, colour, y in (("cold_sequential", COLOURS["cold"], 0.08), ("warm", COLOURS["warm"], 0.22)):
            q = rd[key]["latency_ms"]
            for name in ("p50", "p99"):
                if q.get(name):
                    ax.axvline(q[name], color=colour, linestyle="--", linewidth=0.8)
                    ax.annotate(f"{key.split('_')[0]} {name} {_fmt(q[name], ' ms')}", (q[name], y if name == "p50"
                                else y + 0.55), xytext=(3, 0), textcoords="offset points", color=colour, fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("per-file open + read latency (ms, log scale)")
        ax.set_ylabel("fraction of files")
        ax.set_ylim(0, 1.02)
        if ax.get_legend_handles_labels()[0]:  # no file had a latency: no curve to name
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)

    return _figure(draw)


def _sweep_figure(report: Dict[str, Any]) -> Tuple[str, str]:
    sweep = report["sweep"]
    readers = [r["readers"] for r in sweep]
    rates = [r["files_per_s"] for r in sweep]

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        ax.plot(readers, rates, marker="o", color=COLOURS["bar"])
        for x, y in zip(readers, rates):
            ax.annotate(_fmt(y), (x, y), xytext=(0, 6), textcoords="offset points", ha="center", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(readers, [str(r) for r in readers])
        ax.set_xlabel("concurrent readers (cold)")
        ax.set_ylabel("files/s")
        top = max(rates, default=0.0)
        ax.set_ylim(0, top * 1.2 if top > 0 else 1.0)  # all zero: a flat line needs a height

    if not sweep:
        return "", "no concurrency sweep was measured"
    points = list(zip(readers, rates))  # the same sentence as the verdict's evidence and the text report
    reading = say.concurrency_reading(points)
    sentence = f"Cold reads: {say.concurrency(points)}" + (f": {reading}." if reading else ".")
    return _figure(draw, height=2.8), sentence


def _decode_figure(report: Dict[str, Any]) -> str:
    per = report["decode"]["per_codec"]
    bars: List[Tuple[str, float, str]] = []
    for codec, libs in per.items():
        for lib, c in libs.items():
            bars.append((f"{codec} / {lib}", c["ms"], f"{_fmt(c['ms'], ' ms')}  ({c['mp_per_s']:.0f} MP/s)"))

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        ys = list(range(len(bars)))
        ax.barh(ys, [b[1] for b in bars], color=[SERIES[i % len(SERIES)] for i in ys], height=0.6)
        ax.set_yticks(ys, [b[0] for b in bars])
        ax.invert_yaxis()
        for y, (_, v, label) in zip(ys, bars):
            ax.annotate(label, (v, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
        ax.set_xlabel("ms per image, decoding from memory (one core)")
        ax.set_xlim(0, max([b[1] for b in bars] or [1]) * 1.45)

    return _figure(draw, height=0.5 + 0.35 * max(1, len(bars))) if bars else ""


def _sizes_figure(report: Dict[str, Any]) -> str:
    hist = report["inventory"].get("size_histogram") or []
    q = report["inventory"].get("size_quantiles") or {}
    if not hist:
        return ""

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        edges = [h["le"] for h in hist]
        counts = [h["count"] for h in hist]
        ax.bar(range(len(hist)), counts, color=COLOURS["bar"], width=0.85)
        ax.set_xticks(range(len(hist)), [f"≤{format_size(e)}" for e in edges], rotation=35, ha="right")
        ax.set_ylabel("files")
        ax.set_ylim(0, max(counts) * 1.3)  # room above the bars for the quantile labels
        for name in ("p50", "p99"):
            if name in q:  # where the quantile falls among the bins, interpolated on the log scale
                v = max(q[name], 1)
                pos = next((i for i, e in enumerate(edges) if v <= e), len(edges) - 1)
                lo = edges[pos] / 2
                frac = (math.log2(v) - math.log2(lo)) if v > lo else 0.0
                x = pos - 0.5 + min(max(frac, 0.0), 1.0)
                ax.axvline(x, color=COLOURS["cold"], linestyle="--", linewidth=0.8)
                ax.annotate(f"{name} {format_size(q[name])}", (x, max(counts) * (1.2 if name == "p50" else 1.08)),
                            xytext=(3, 0), textcoords="offset points", color=COLOURS["cold"], fontsize=8)

    return _figure(draw, height=2.8)


def _stall_figure(report: Dict[str, Any]) -> str:
    pw = report["verdict"]["per_worker_ms"]
    parts = [("read", pw["read"], COLOURS["read"]), ("per-file overhead", pw["overhead"], COLOURS["overhead"]),
             ("decode", pw["decode"], COLOURS["decode"]), ("transform", pw.get("transform", 0.0), COLOURS["line"]),
             ("other", pw.get("other", 0.0), COLOURS["nofit"])]

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        left = 0.0
        for label, v, colour in parts:
            ax.barh([0], [v], left=left, color=colour, label=f"{label} {_fmt(v, ' ms')}", height=0.5)
            if v > 0.12 * max(pw["total"], 1e-9):  # narrower segments: the legend says it
                ax.annotate(_fmt(v, " ms"), (left + v / 2, 0), ha="center", va="center", color="white", fontsize=8)
            left += v
        ax.set_yticks([0], ["one worker,\nper sample"])
        ax.set_xlabel(f"ms per sample (total {_fmt(pw['total'], ' ms')})")
        ax.set_xlim(0, max(left, 1e-6) * 1.02)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=5, frameon=False)

    return _figure(draw, height=1.7)


def _formats_figure(report: Dict[str, Any]) -> str:
    v = report["verdict"]
    free = report["disk"]["free_bytes"]
    options = ["source as it is"] + list(v["predicted_per_s"])
    rates = [v["loader_per_s"]] + list(v["predicted_per_s"].values())
    sizes = [None] + [v["output_bytes"][k] for k in v["predicted_per_s"]]
    fits = [True] + [v["fits"][k] for k in v["predicted_per_s"]]

    def draw(fig: Any) -> None:
        from matplotlib.ticker import FuncFormatter

        ax, bx = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
        ys = list(range(len(options)))
        colours = [COLOURS["source"]] + [COLOURS["bar"] if f else COLOURS["nofit"] for f in fits[1:]]
        ax.barh(ys, rates, color=colours, height=0.6, hatch=None)
        ax.set_yticks(ys, options)
        ax.invert_yaxis()
        for y, r, f in zip(ys, rates, fits):
            ax.annotate(f"{_fmt(r)}/s" + ("" if f else " (does not fit)"), (r, y), xytext=(4, 0),
                        textcoords="offset points", va="center", fontsize=8)
        if report["measurements"].get("target"):
            ax.axvline(report["measurements"]["target"], color=COLOURS["line"], linestyle=":", linewidth=1)
            ax.annotate(f"target {_fmt(report['measurements']['target'])}/s", (report["measurements"]["target"], -0.6),
                        fontsize=8, ha="center")
        ax.set_xscale("log")
        ax.set_xlabel(f"predicted samples/s with {v['workers']} workers (log scale)")
        ax.set_xlim(min(r for r in rates if r > 0) / 2 if any(r > 0 for r in rates) else 1, max(rates) * 8)
        sz = [s or 0 for s in sizes]
        bx.barh(ys[1:], sz[1:], color=colours[1:], height=0.6)
        bx.set_yticks(ys[1:], [""] * len(ys[1:]))
        bx.set_ylim(ax.get_ylim())
        for y, s in zip(ys[1:], sz[1:]):
            bx.annotate(format_size(s), (s, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
        if free:
            bx.axvline(free, color=COLOURS["cold"], linestyle="--", linewidth=1)
            bx.annotate(f"free: {format_size(free)}", (free, 0), xytext=(-3, 0), textcoords="offset points",
                        ha="right", va="center", color=COLOURS["cold"], fontsize=8)
        bx.set_xlabel("output size, log scale (dashed: free space)")
        positive = [x for x in sz[1:] + [free or 0] if x > 0] or [1]
        bx.set_xscale("log")
        bx.set_xlim(min(positive) / 3, max(positive) * 6)
        bx.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_size(x)))
        bx.tick_params(axis="x", labelrotation=30)

    return _figure(draw, width=9, height=0.9 + 0.42 * len(options))


def analyze_html(report: Dict[str, Any]) -> str:
    """The analyze report (schema ``dsconvert.analyze``) as one self-contained HTML page."""
    v = report["verdict"]
    rd = report["read"]
    inv = report["inventory"]
    body: List[str] = []
    ok = v["bottleneck"] == "none"
    body.append(f"<section class=\"verdict{' ok' if ok else ''}\"><h2>Verdict: {_esc(v['bottleneck'])}</h2>"
                f"<p class=\"summary\">{_esc(v['summary'])}</p><ul>"
                + "".join(f"<li>{_esc(e)}</li>" for e in v["evidence"]) + "</ul>")
    if v["commands"]:
        body.append("<h3>Fix</h3>" + _commands(v["commands"]))
    if v.get("alternative"):
        body.append("<h3>Or</h3>" + _commands(v["alternative"]))
    if v.get("recommended"):
        body.append(f"<p>{_esc(say.fastest(v))}</p>")
    body.append("<ul class=\"notes\">" + "".join(f"<li>{_esc(n)}</li>" for n in v["notes"]) + "</ul></section>")

    lo = report.get("loader") or {}
    passes = lo.get("passes") or {}
    body.append("<section><h2>Where one worker's time goes</h2>"
                f"<figure>{_stall_figure(report)}<figcaption>{_esc(say.split_caption(v, lo, passes))}"
                "</figcaption></figure></section>")
    body.append("<section><h2>Outputs under the disk budget</h2>"
                f"<figure>{_formats_figure(report)}<figcaption>Predicted samples/s of each output with "
                f"{v['workers']} workers next to the source as it is, and each output's size against the free space at "
                f"{_esc(report['disk']['output_dir'])}. Grey bars do not fit. Each rate was measured: the sample "
                "converted into that output and read back through the same DataLoader and transform."
                "</figcaption></figure></section>")
    rows = []
    for label, key in (("cold, sequential", "cold_sequential"), ("cold, random", "cold_random"), ("warm", "warm")):
        r = rd[key]
        lat = r["latency_ms"]
        rows.append((label, _fmt(r["files_per_s"]), _fmt(r["mb_per_s"]), _fmt(lat.get("p50", 0)),
                     _fmt(lat.get("p90", 0)), _fmt(lat.get("p99", 0))))
    body.append("<section><h2>Read latency, cold and warm</h2>"
                f"<figure>{_latency_figure(report)}<figcaption>Each sampled file's open + read time ("
                f"{report['sample']['files']} files, seed {report['sample']['seed']}); cold reads follow page-cache "
                "eviction (on object stores: first requests). Dashed lines mark p50 and p99. Per-file fixed cost "
                f"(fitted): {_fmt(rd['fixed_ms_per_file'], ' ms')}.</figcaption></figure>"
                + _table(["pass", "files/s", "MB/s", "p50 ms", "p90 ms", "p99 ms"], rows) + "</section>")
    sweep_svg, sentence = _sweep_figure(report)
    body.append(f"<section><h2>Concurrent readers</h2><figure>{sweep_svg}<figcaption>{_esc(sentence)}</figcaption>"
                "</figure></section>")
    decode_svg = _decode_figure(report)
    if decode_svg:
        g = report["decode"].get("images") or {}
        extra = (f" Images: {g['width']['p50']:.0f} x {g['height']['p50']:.0f} median." if g else "")
        body.append(f"<section><h2>Decode cost per codec and library</h2><figure>{decode_svg}<figcaption>"
                    f"Decoding each sampled image from memory with every library that loads here.{_esc(extra)}"
                    "</figcaption></figure></section>")
    sizes_svg = _sizes_figure(report)
    if sizes_svg:
        est = ("" if inv["complete"]
               else f" (listing stopped at the time budget; about {inv['estimated_files']:,} in all)")
        body.append(f"<section><h2>File sizes</h2><figure>{sizes_svg}<figcaption>{inv['files']:,} files, "
                    f"{format_size(inv['bytes'])}{_esc(est)}; storage {_esc(report['storage']['kind'])} "
                    f"({_esc(report['storage']['fstype'])} at {_esc(report['storage']['mount'])}).</figcaption>"
                    "</figure></section>")
    footer = (f"dsconvert {__version__} analyze, schema {_esc(report['schema'])}/{report['schema_version']}, "
              f"measured in {report['seconds']:.1f} s")
    return _page("dsconvert analyze", report["source"], body, footer)


# --- bench -----------------------------------------------------------------------------------


def _bench_figure(report: Dict[str, Any]) -> str:
    runs = report["runs"]
    labels = {d["path"]: d["label"] for d in report["datasets"]}
    caches = [c for c in ("cold", "warm") if any(r["cache"] == c for r in runs)]
    batches = sorted({r["batch_size"] for r in runs})
    styles = ["-", "--", ":", "-."]

    def draw(fig: Any) -> None:
        axes = fig.subplots(1, len(caches), sharey=True, squeeze=False)[0]
        top = max(r["samples_per_s"] for r in runs) or 1
        for ax, cache in zip(axes, caches):
            for i, d in enumerate(report["datasets"]):
                for j, b in enumerate(batches):
                    pts = sorted((r["workers"], r["samples_per_s"]) for r in runs
                                 if r["dataset"] == d["path"] and r["cache"] == cache and r["batch_size"] == b)
                    if not pts:
                        continue
                    xs, ys = zip(*pts)
                    name = labels[d["path"]] + (f", batch {b}" if len(batches) > 1 else "")
                    ax.plot(xs, ys, marker="o", linestyle=styles[j % len(styles)], color=SERIES[i % len(SERIES)],
                            label=name)
                    for x, y in pts:
                        ax.annotate(_fmt(y), (x, y), xytext=(0, 5), textcoords="offset points", ha="center",
                                    fontsize=7, color=SERIES[i % len(SERIES)])
            workers = sorted({r["workers"] for r in runs})
            ax.set_xticks(workers, [str(w) for w in workers])
            ax.set_xlabel("DataLoader workers")
            ax.set_title(f"{cache} page cache", fontsize=10)
            ax.set_ylim(0, top * 1.2)
        axes[0].set_ylabel("samples/s (steady state)")
        axes[-1].legend(loc="upper left", frameon=False, fontsize=8)

    return _figure(draw, width=9, height=3.4)


def bench_html(report: Dict[str, Any]) -> str:
    """The bench report (schema ``dsconvert.bench``) as one self-contained HTML page."""
    s = report["settings"]
    labels = {d["path"]: d["label"] for d in report["datasets"]}
    best = max(report["runs"], key=lambda r: r["samples_per_s"])
    first = report["datasets"][0]
    what = (f"{s['size']}x{s['size']} crops as uint8 tensors" if s["size"] and s["decode"] not in ("raw", "buffer")
            else "samples as they come")
    body = [f"<section class=\"verdict ok\"><h2>Fastest: {_esc(labels[best['dataset']])}</h2>"
            f"<p class=\"summary\">{_fmt(best['samples_per_s'])} samples/s with {best['workers']} workers, batch "
            f"{best['batch_size']}, {best['cache']} page cache"
            + (f": {best['vs_first']:.2f}x {_esc(first['label'])}" if best.get("vs_first") else "") + "</p>"
            f"<p>Through a real torch DataLoader, decode={_esc(s['decode'])}, {_esc(what)}, up to "
            f"{s['max_samples']} samples per pass, {s['cpus']} CPUs.</p></section>"]
    body.append(f"<section><h2>Samples/s against DataLoader workers</h2><figure>{_bench_figure(report)}"
                "<figcaption>One line per dataset: the source as it is against its conversions, cold (pages evicted "
                "first) and warm; steady-state rates, from the first batch to the last.</figcaption></figure>")
    rows = [(labels[r["dataset"]], r["workers"], r["batch_size"], r["cache"], _fmt(r["samples_per_s"]),
             _fmt(r["mb_per_s"]), f"{r['startup_s']:.2f}", _fmt(r["wait_ms"]["p50"]), _fmt(r["wait_ms"]["p99"]),
             "-" if r["worker_cpu_pct"] is None else f"{r['worker_cpu_pct']:.0f}%",
             "-" if not r.get("vs_first") else f"{r['vs_first']:.2f}x") for r in report["runs"]]
    body.append(_table(["dataset", "workers", "batch", "cache", "samples/s", "MB/s", "startup s", "wait p50 ms",
                        "wait p99 ms", "worker CPU", "vs first"], rows) + "</section>")
    footer = (f"dsconvert {__version__} bench, schema {_esc(report['schema'])}/{report['schema_version']}, "
              f"{report['seconds']:.1f} s in all")
    return _page("dsconvert bench", ", ".join(d["path"] for d in report["datasets"]), body, footer)


def write(path: str, page: str) -> str:
    """Write the page atomically; return its path."""
    from .io.localfs import atomic_write

    with atomic_write(path, "w") as f:
        f.write(page)
    return path


def numbers_in(page: str) -> List[str]:
    """The text of the page's SVG ``<text>`` elements (for tests and checks)."""
    return [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", page)]


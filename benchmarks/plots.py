"""PNG plots of a results.json (matplotlib, Agg backend). `python -m benchmarks.plots RESULTS_DIR` redraws them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _by(results: list[dict[str, Any]], scenario: str) -> list[dict[str, Any]]:
    return [r for r in results if r["scenario"] == scenario and r["value"] is not None]


def _target(r: dict[str, Any]) -> float | None:
    for ref in r["references"]:
        if ref["kind"] == "target":
            return ref["value"]
    return None


def _load_note(rs: list[dict[str, Any]]) -> str:
    loads = [r["loadavg"][0] for r in rs]
    return f"1-min load average during these runs: {min(loads):.1f}–{max(loads):.1f} (2 cores, shared)" if loads else ""


def plot_all(out: Path, data: dict[str, Any]) -> list[str]:
    plt = _plt()
    results = data["results"]
    written: list[str] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)

    prod = [r for r in _by(results, "produce") if r["name"].endswith("_mib_s")]
    if prod:
        backends = sorted({r["backend"] for r in prod})
        labels = sorted({r["name"].removesuffix("_mib_s") for r in prod},
                        key=lambda s: (int(s.split("B")[0]), s.split("_")[1], int(s.split("_p")[-1])))
        fig, ax = plt.subplots(figsize=(11, 4.8))
        width = 0.8 / len(backends)
        for i, be in enumerate(backends):
            vals = {r["name"].removesuffix("_mib_s"): r["value"] for r in prod if r["backend"] == be}
            xs = [j + i * width for j in range(len(labels))]
            ax.bar(xs, [vals.get(lab, 0) for lab in labels], width, label=be)
        for r in prod:
            t = _target(r)
            if t:
                j = labels.index(r["name"].removesuffix("_mib_s")) + backends.index(r["backend"]) * width
                ax.plot([j - width / 2, j + width / 2], [t, t], "r-", lw=2)
        ax.set_xticks([j + width * (len(backends) - 1) / 2 for j in range(len(labels))], labels, rotation=35,
                      ha="right", fontsize=8)
        ax.set_ylabel("MiB/s")
        ax.set_title("Produce throughput (red: target)\n" + _load_note(prod), fontsize=9)
        ax.legend()
        save(fig, "produce_throughput.png")

        lat = [r for r in _by(results, "produce") if "_latency_" in r["name"]]
        fig, ax = plt.subplots(figsize=(11, 4.8))
        series = sorted({(r["backend"], r["name"].split("_latency_")[0]) for r in lat},
                        key=lambda t: (t[0], int(t[1].split("B")[0]), t[1]))
        qs = ["p50_ms", "p99_ms", "p999_ms"]
        width = 0.8 / len(qs)
        for i, q in enumerate(qs):
            vals = {(r["backend"], r["name"].split("_latency_")[0]): r["value"] for r in lat
                    if r["name"].endswith(q)}
            ax.bar([j + i * width for j in range(len(series))], [vals.get(s, 0) for s in series], width, label=q)
        ax.set_xticks([j + width for j in range(len(series))], [f"{b}\n{s}" for b, s in series], rotation=60,
                      ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("ms (log)")
        ax.axhline(60, color="g", ls="--", lw=1, label="p50 target 60 ms")
        ax.axhline(150, color="r", ls="--", lw=1, label="p99 target 150 ms")
        ax.set_title("Produce delivery latency at saturation (includes client queueing)", fontsize=9)
        ax.legend(fontsize=7)
        save(fig, "produce_latency.png")

    e2e = _by(results, "end_to_end")
    hists = [(r["backend"], r["name"], r["extra"]["latency"]["hist"]) for r in e2e
             if r["name"].endswith("p50_ms") and r["extra"].get("latency")]
    if hists:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        for backend, name, hist in hists:
            total = sum(c for _, c in hist) or 1
            acc = 0
            xs, ys = [], []
            for edge, c in hist:
                acc += c
                xs.append(edge)
                ys.append(acc / total)
            label = ("end-to-end" if name.startswith("e2e") else "produce acks=all") + f" [{backend}]"
            ax.step(xs, ys, where="post", label=label)
        ax.set_xscale("log")
        ax.set_xlabel("latency, ms (log)")
        ax.set_ylabel("cumulative fraction")
        ax.axvline(100, color="r", ls="--", lw=1, label="e2e p50 target 100 ms")
        ax.set_title("Latency at a fixed moderate rate (CDF)\n" + _load_note(e2e), fontsize=9)
        ax.legend(fontsize=8)
        save(fig, "end_to_end_latency.png")

    cu = [r for r in _by(results, "catchup") if r["name"] == "cold_read_mib_s"]
    if cu:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        for r in cu:
            prog = r["extra"]["reader"]["progress"]
            ax.plot([p[0] for p in prog], [p[1] / 2**20 for p in prog],
                    label=f"{r['backend']}: {r['value']:.0f} MiB/s")
        ax.set_xlabel("seconds since assign()")
        ax.set_ylabel("MiB read")
        ax.set_title("Cold catch-up read (broker restarted, page cache dropped)\n" + _load_note(cu), fontsize=9)
        ax.legend()
        save(fig, "catchup.png")

    kc = _by(results, "kcat_spec")
    if kc:
        names = list(dict.fromkeys(r["name"] for r in kc))
        backends = sorted({r["backend"] for r in kc})
        fig, ax = plt.subplots(figsize=(10, 4.5))
        width = 0.8 / (len(backends) + 1)
        pub = {r["name"]: next(x["value"] for x in r["references"] if x["kind"] == "limit") for r in kc}
        ax.bar(range(len(names)), [pub[n] for n in names], width, label="published (Go Kafscale)", color="grey")
        for i, be in enumerate(backends):
            vals = {r["name"]: r["value"] for r in kc if r["backend"] == be}
            ax.bar([j + (i + 1) * width for j in range(len(names))], [vals.get(n, 0) for n in names], width,
                   label=f"ours [{be}]")
        for j, n in enumerate(names):
            t = next(x["value"] for r in kc if r["name"] == n for x in r["references"] if x["kind"] == "target")
            ax.plot([j - width / 2, j + width * (len(backends) + 0.5)], [t, t], "r-", lw=2)
        ax.set_xticks([j + width * len(backends) / 2 for j in range(len(names))], names, rotation=20, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("msg/s (log)")
        ax.set_title("kcat scenario of the specification project (red: target)\n" + _load_note(kc), fontsize=9)
        ax.legend(fontsize=8)
        save(fig, "kcat_spec.png")

    sc = _by(results, "scale")
    rss = [r for r in sc if r["name"].startswith("rss_bytes_") and "partitions" in r["name"]]
    if rss:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
        for kind in ("created", "open"):
            pts = sorted((r["settings"]["partitions"], r["value"] / 2**30) for r in rss if r["name"].endswith(kind))
            if pts:
                a1.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"partitions {kind}")
        a1.axhline(4, color="r", ls="--", lw=1, label="target 4 GiB")
        a1.set_xscale("log")
        a1.set_xlabel("partitions")
        a1.set_ylabel("RSS, GiB (all broker processes)")
        a1.legend(fontsize=8)
        md = [r for r in sc if r["name"].startswith("metadata_")]
        for label in ("all_topics_p50", "all_topics_p99", "one_topic_p50", "one_topic_p99"):
            pts = sorted((r["settings"]["partitions"], r["value"]) for r in md if f"_{label}_" in r["name"])
            if pts:
                a2.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
        a2.set_xscale("log")
        a2.set_yscale("log")
        a2.set_xlabel("partitions")
        a2.set_ylabel("Metadata request, ms")
        a2.legend(fontsize=8)
        fig.suptitle("Scale on one node (local store)\n" + _load_note(sc), fontsize=9)
        save(fig, "scale.png")

    lim = _by(results, "limits")
    if lim:
        fig, ax = plt.subplots(figsize=(8, 4))
        labels = [f"{r['name']}\n[{r['backend']}]" for r in lim]
        ax.bar(range(len(lim)), [r["value"] for r in lim], color="tab:purple")
        ax.set_xticks(range(len(lim)), labels, fontsize=8)
        ax.set_ylabel("MiB/s")
        ax.set_title("Limits measured in the same run\n" + _load_note(lim), fontsize=9)
        save(fig, "limits.png")

    samples = data.get("loadavg_samples") or []
    if samples:
        fig, ax = plt.subplots(figsize=(9, 3))
        ax.plot([s[0] for s in samples], [s[1] for s in samples], label="1-min load average")
        ax.axhline(data["machine"].get("cpu_count") or 2, color="r", ls="--", lw=1, label="CPU count")
        ax.set_xlabel("seconds since start")
        ax.legend(fontsize=8)
        ax.set_title("Machine load during the run", fontsize=9)
        save(fig, "load.png")
    return written


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    print(plot_all(folder, json.loads((folder / "results.json").read_text())))

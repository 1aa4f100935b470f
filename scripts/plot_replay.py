#!/usr/bin/python3
"""Draws a replay of the main example (inference_server) from its --json summary and
its --timeline CSV: TTFT and TBT CDFs per QoS tier, throughput and queue depth over
trace time, and the batch-size histogram, into one PNG.

usage: scripts/plot_replay.py --json SUMMARY.json --timeline TIMELINE.csv --out replay.png

Needs python3-matplotlib (Debian). Exit status 0 written; 1 an input cannot be read
or lacks a field the plot needs; 2 usage.
"""
import argparse
import csv
import json
import sys

TIERS = ("gold", "silver", "bronze")
COLORS = {"gold": "#d4a017", "silver": "#7f8c8d", "bronze": "#a0522d"}


def fail(msg):
    print(f"plot_replay: {msg}", file=sys.stderr)
    sys.exit(1)


def read_summary(path):
    try:
        with open(path) as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"--json '{path}': {e}")
    for tier in TIERS:
        t = summary.get(f"tier_{tier}")
        if not isinstance(t, dict) or "ttft_cdf_ms" not in t or "tbt_cdf_ms" not in t:
            fail(f"--json '{path}': tier_{tier} has no ttft_cdf_ms / tbt_cdf_ms "
                 "(written by inference_server --json of this version)")
    return summary


def read_timeline(path):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        fail(f"--timeline '{path}': {e}")
    need = ("trace_s", "tokens", "queued")
    if not rows or any(k not in rows[0] for k in need):
        fail(f"--timeline '{path}': no rows with columns {', '.join(need)}")
    try:
        return [{k: float(r[k]) for k in need} for r in rows]
    except ValueError as e:
        fail(f"--timeline '{path}': {e}")


def main():
    # The docstring's first paragraph says what it draws; its last, the exit status.
    paragraphs = __doc__.strip().split("\n\n")
    ap = argparse.ArgumentParser(description=" ".join(paragraphs[0].split()),
                                 epilog=" ".join(paragraphs[-1].split()))
    ap.add_argument("--json", required=True, help="inference_server --json summary")
    ap.add_argument("--timeline", required=True, help="inference_server --timeline CSV")
    ap.add_argument("--out", required=True, help="the PNG to write")
    args = ap.parse_args()
    summary = read_summary(args.json)
    rows = read_timeline(args.timeline)

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib is missing for this python3: ./scripts/install-deps.sh --for plot "
             "installs Debian's python3-matplotlib (for /usr/bin/python3)")

    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    pct = [q / 100 for q in range(1, 101)]
    for i, (key, title) in enumerate((("ttft_cdf_ms", "Time to first token"), ("tbt_cdf_ms", "Time between tokens"))):
        a = ax[0][i]
        for tier in TIERS:
            t = summary[f"tier_{tier}"]
            if t.get("requests", 0) == 0:
                continue
            a.plot(t[key], pct, label=f"{tier} ({t['requests']} requests)", color=COLORS[tier])
        a.set_xscale("log")
        a.set_xlabel("ms, trace time (log)")
        a.set_ylabel("fraction")
        a.set_title(f"{title}: CDF per tier")
        a.grid(True, which="both", alpha=0.3)
        a.legend()

    a = ax[1][0]
    xs, tps = [], []
    for prev, cur in zip(rows, rows[1:]):
        dt = cur["trace_s"] - prev["trace_s"]
        if dt > 0:
            xs.append(cur["trace_s"])
            tps.append((cur["tokens"] - prev["tokens"]) / dt)
    a.plot(xs, tps, color="#2c7fb8", linewidth=0.8, label="tokens per trace second")
    a.set_xlabel("trace time (s)")
    a.set_ylabel("tokens / s (trace time)")
    a.set_title("Throughput and queue depth over trace time")
    a.grid(True, alpha=0.3)
    b = a.twinx()
    b.plot([r["trace_s"] for r in rows], [r["queued"] for r in rows], color="#e34a33", linewidth=0.8,
           label="steps queued at the replicas")
    b.set_ylabel("queued")
    h1, l1 = a.get_legend_handles_labels()
    h2, l2 = b.get_legend_handles_labels()
    a.legend(h1 + h2, l1 + l2, loc="upper left")

    a = ax[1][1]
    sizes = summary.get("batches_by_size")
    if sizes:
        labels = []
        for k in range(len(sizes)):
            lo, hi = 1 << k, (2 << k) - 1
            labels.append(str(lo) if lo == hi else f"{lo}-{hi}")
        last = max((k for k, n in enumerate(sizes) if n), default=0)
        a.bar(labels[: last + 1], sizes[: last + 1], color="#31a354")
        a.set_xlabel("messages per batch")
        a.set_ylabel("batches")
        a.set_title("Batch sizes (adaptive batcher)")
        a.grid(True, axis="y", alpha=0.3)
    else:
        a.text(0.5, 0.5, "no batches in this summary\n(--role client: the replicas batch)", ha="center",
               va="center")
        a.set_axis_off()

    fig.suptitle(f"inference_server: {summary.get('requests_total', '?')} requests, "
                 f"{summary.get('tokens_delivered', '?')} tokens, "
                 f"{summary.get('wall_seconds', 0):.0f} s wall")
    fig.tight_layout()
    try:
        fig.savefig(args.out, dpi=100)
    except OSError as e:
        fail(f"--out '{args.out}': {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Turns bench_routing_peers JSON files (one per full run, --benchmark_format=json)
into the Markdown tables of BENCHMARKS.md: the median of the runs for every
benchmark, and each figure's ratio to the best inferq configuration.

usage: benchmarks/report_routing_peers.py run1.json run2.json run3.json
"""
import collections
import json
import re
import statistics
import sys

COUNTERS = ("items_per_second", "delivered", "lost", "dup_or_reordered", "wrong_subject",
            "p50_us", "p99_us", "max_us", "cpu_ns_per_event", "published_per_second",
            "send_lag_p99_us")


def main(paths):
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for path in paths:
        for b in json.load(open(path))["benchmarks"]:
            if b.get("run_type") == "aggregate":
                continue
            name = re.sub(r"/(iterations:\d+|manual_time|real_time)", "", b["name"])
            for c in COUNTERS:
                if c in b:
                    runs[name][c].append(b[c])
    med = {n: {c: statistics.median(v) for c, v in cs.items()} for n, cs in runs.items()}
    n_runs = min(len(v["p50_us"]) for v in runs.values())
    for family, title in (("BM_PubSub", "as fast as the publisher goes, 2,000,000 events"),
                          ("BM_PubSubLatency", "paced at 100,000 events/s, 300,000 events")):
        rows = {n.split("/", 1)[1]: m for n, m in med.items() if n.split("/")[0] == family}
        print(f"\n### {family}: {title} (medians of {n_runs} runs)\n")
        print("| impl / config | delivered/s | lost | dup/reord | p50 µs | p99 µs | "
              "CPU ns/event | published/s |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for impl, m in sorted(rows.items(), key=lambda kv: -kv[1]["items_per_second"]):
            print(f"| {impl} | {m['items_per_second'] / 1e3:,.0f} k | {m['lost']:,.0f} | "
                  f"{m['dup_or_reordered']:,.0f} | {m['p50_us']:,.1f} | {m['p99_us']:,.1f} | "
                  f"{m['cpu_ns_per_event']:,.0f} | {m['published_per_second'] / 1e3:,.0f} k |")


if __name__ == "__main__":
    main(sys.argv[1:])

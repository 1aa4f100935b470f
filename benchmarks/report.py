#!/usr/bin/env python3
"""Turns a bench_rings JSON file (--benchmark_format=json, with repetitions and
--benchmark_report_aggregates_only) into the Markdown tables of BENCHMARKS.md:
medians per implementation and the ratio of MpmcRing to the best peer.

usage: benchmarks/report.py bench_rings.json
"""
import collections
import json
import re
import sys

OURS = ("MpmcRing", "FixedPool")


def main(path):
    data = json.load(open(path))
    rows = collections.defaultdict(dict)  # family/config -> impl -> value
    units = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name", "median") != "median":
            continue
        name = re.sub(r"/(min_time:[^/]+|real_time|iterations:\d+)", "", b["run_name"])
        parts = name.split("/")
        family, impl, config = parts[0], parts[1], "/".join(parts[2:])
        key = (family, config)
        if "items_per_second" in b:
            rows[key][impl] = b["items_per_second"] / 1e6
            units[key] = "M items/s (higher is better)"
        elif "cpu_s_per_item" in b:
            rows[key][impl] = (b["cpu_s_per_item"] * 1e6, b["p50_us"], b["p99_us"])
            units[key] = "CPU µs per item, p50 µs, p99 µs (lower is better)"
        else:
            rows[key][impl] = b["real_time"]
            units[key] = b["time_unit"] + " per round trip (lower is better)"
    for key in sorted(rows):
        family, config = key
        print(f"\n### {family} {config}  ({units[key]})\n")
        impls = rows[key]
        higher = "higher" in units[key]
        print("| impl | median | ours vs this |")
        print("|---|---:|---:|")
        ours = next((impls[o] for o in OURS if o in impls), None)
        for impl, v in sorted(impls.items(), key=lambda kv: -kv[1] if higher and not isinstance(kv[1], tuple) else (kv[1] if not isinstance(kv[1], tuple) else kv[1][0])):
            if isinstance(v, tuple):
                shown = f"{v[0]:.1f} / {v[1]:.1f} / {v[2]:.1f}"
                ratio = f"{v[0] / ours[0]:.2f}x CPU" if ours and impl not in OURS else ""
            else:
                shown = f"{v:.2f}" if higher else f"{v:.0f}"
                if ours is None or impl in OURS:
                    ratio = ""
                elif higher:
                    ratio = f"{ours / v:.2f}x"
                else:
                    ratio = f"{v / ours:.2f}x"
            print(f"| {impl} | {shown} | {ratio} |")


if __name__ == "__main__":
    main(sys.argv[1])

#!/usr/bin/env python3
"""Turns a bench_routing JSON file (--benchmark_format=json, with repetitions) into the
Markdown tables of BENCHMARKS.md for subject matching (BM_Match, BM_Insert) and member
selection (BM_Select): the median over the repetitions of CPU ns per operation, and
the counters each benchmark reports. The fan-out tables against ZeroMQ and NNG come
from benchmarks/report_routing_peers.py on the same file.

usage: benchmarks/report_routing.py bench_routing.json
"""
import collections
import json
import statistics
import sys


def main(path):
    rows = collections.defaultdict(lambda: collections.defaultdict(list))
    for b in json.load(open(path))["benchmarks"]:
        if b.get("run_type") == "aggregate":
            continue
        name = b["run_name"] if "run_name" in b else b["name"]
        if not name.startswith(("BM_Match", "BM_Select", "BM_Insert")):
            continue
        ips = b.get("items_per_second")
        if ips:
            rows[name]["ns"].append(1e9 / ips)
        for k, v in b.items():
            if k in ("bytes_per_sub", "values_per_match", "hit_rate", "memory_bytes"):
                rows[name][k].append(v)

    def med(name, key):
        v = rows[name].get(key)
        return statistics.median(v) if v else None

    print("\n### BM_Match: ns per match (median CPU time)\n")
    print("| set | subscriptions | hit | miss | miss_hot | fill | bytes per subscription |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for s in ("literal", "wildcard"):
        for subs in ("10", "10000", "1000000"):
            cells = []
            bps = None
            for mode in ("hit", "miss", "miss_hot", "fill"):
                n = f"BM_Match/{s}/{subs}/{mode}"
                v = med(n, "ns")
                cells.append(f"{v:,.0f}" if v is not None else "–")
                bps = bps or med(n, "bytes_per_sub")
            print(f"| {s} | {int(subs):,} | " + " | ".join(cells) +
                  f" | {bps:,.0f} |" if bps else f"| {s} | {int(subs):,} | " + " | ".join(cells) + " | – |")

    print("\n### BM_Select: ns per decision (median CPU time)\n")
    print("| policy | 4 members | 64 members |")
    print("|---|---:|---:|")
    policies = sorted({n.split("/")[1] for n in rows if n.startswith("BM_Select/")},
                      key=lambda p: ["round_robin", "least_loaded", "peak_ewma", "topology_score",
                                     "consistent_hash", "weighted_shadow", "affinity"].index(p))
    for p in policies:
        a = med(f"BM_Select/{p}/4", "ns")
        b = med(f"BM_Select/{p}/64", "ns")
        print(f"| {p} | {a:,.0f} | {b:,.0f} |")


if __name__ == "__main__":
    main(sys.argv[1])

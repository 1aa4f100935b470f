#!/usr/bin/env python3
"""Turns bench_routing JSON files (its BM_PubSub* benchmarks) (--benchmark_format=json; one per full run,
each run may hold repetitions) into the Markdown tables of BENCHMARKS.md: for every
benchmark the median over all repetitions of all runs, and for the throughput and
the latency percentiles the range of the per-run medians (how much the runs agree),
and the ratio of the reference inferq configuration (one stream, interest retention,
no acks, NextBatch) to each row.

usage: benchmarks/report_routing_peers.py run1.json [run2.json ...]
"""
import collections
import json
import re
import statistics
import sys

REFERENCE = "inferq/stream:one/ret:interest/ack:none/pull:batch"
COUNTERS = ("items_per_second", "lost", "dup_or_reordered", "wrong_subject", "p50_us",
            "p99_us", "cpu_ns_per_event", "published_per_second")


def main(paths):
    # name -> counter -> [per-run list of values]
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for path in paths:
        per_file = collections.defaultdict(lambda: collections.defaultdict(list))
        for b in json.load(open(path))["benchmarks"]:
            if b.get("run_type") == "aggregate":
                continue
            name = re.sub(r"/(iterations:\d+|manual_time|real_time)", "", b["name"])
            if not name.startswith("BM_PubSub"):
                continue  # BM_Match, BM_Select: benchmarks/report_routing.py
            for c in COUNTERS:
                if c in b:
                    per_file[name][c].append(b[c])
        for name, cs in per_file.items():
            for c, v in cs.items():
                runs[name][c].append(v)

    def med(name, c):
        return statistics.median(x for run in runs[name][c] for x in run)

    def spread(name, c, scale, fmt):
        meds = [statistics.median(run) / scale for run in runs[name][c]]
        return f" [{fmt.format(min(meds))}–{fmt.format(max(meds))}]" if len(meds) > 1 else ""

    samples = min(sum(len(r) for r in cs["p50_us"]) for cs in runs.values())
    for family, title in (("BM_PubSub", "as fast as the publisher goes, 2,000,000 events"),
                          ("BM_PubSubLatency", "paced at 100,000 events/s, 300,000 events")):
        names = [n for n in runs if n.split("/")[0] == family]
        if not any("/inferq/" in n for n in names):
            continue
        ref = next((n for n in names if n.endswith(REFERENCE)), None)
        print(f"\n### {family}: {title}\n")
        print(f"Medians of {samples} repetitions ({len(paths)} run(s)), [range of the per-run "
              f"medians] when there are several runs. inferq vs this: the reference "
              f"configuration ({REFERENCE}) over the row for delivered/s, the row over the "
              f"reference for p99 (above 1: inferq is better).\n")
        print("| impl / config | delivered/s | lost | dup/reord | p50 µs | p99 µs | inferq vs this | "
              "CPU ns/event | published/s |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n in sorted(names, key=lambda n: -med(n, "items_per_second") if family == "BM_PubSub"
                        else med(n, "p99_us")):
            if ref is None or n == ref:
                ratio = ""
            elif family == "BM_PubSub":
                ratio = f"{med(ref, 'items_per_second') / med(n, 'items_per_second'):.2f}x"
            else:
                ratio = f"{med(n, 'p99_us') / med(ref, 'p99_us'):.2f}x p99"
            print(f"| {n.split('/', 1)[1]} "
                  f"| {med(n, 'items_per_second') / 1e3:,.0f} k"
                  f"{spread(n, 'items_per_second', 1e3, '{:,.0f}')} "
                  f"| {med(n, 'lost'):,.0f} | {med(n, 'dup_or_reordered'):,.0f} "
                  f"| {med(n, 'p50_us'):,.1f}{spread(n, 'p50_us', 1, '{:,.0f}')} "
                  f"| {med(n, 'p99_us'):,.0f}{spread(n, 'p99_us', 1, '{:,.0f}')} "
                  f"| {ratio} "
                  f"| {med(n, 'cpu_ns_per_event'):,.0f} "
                  f"| {med(n, 'published_per_second') / 1e3:,.0f} k |")


if __name__ == "__main__":
    main(sys.argv[1:])

#!/usr/bin/env python3
"""Turns a bench_engine JSON file (--benchmark_format=json, with repetitions) into the
Markdown tables of BENCHMARKS.md: the median over the repetitions of

  BM_BatcherDecide  CPU ns per Decide;
  BM_QosPick        CPU ns per pick (one Pop + one Push), and its ratio to the naive
                    std::priority_queue peer of the same run;
  BM_EndToEnd       events/s (publish -> batch -> ack), publish -> ack p50 / p99,
                    process CPU per event, events per pull, and inferq against each
                    implementation with the same number of members;
  BM_EndToEndPaced  the same at 20,000 events/s, where the latency is the figure.

Each end-to-end row also carries the range of its repetitions for events/s and p99
(how much they agree), and the lost / bad_checksum counters must be 0 (the script
says so when they are not).

usage: benchmarks/report_engine.py bench_engine.json
"""
import collections
import json
import re
import statistics
import sys


def main(path):
    rows = collections.defaultdict(lambda: collections.defaultdict(list))
    for b in json.load(open(path))["benchmarks"]:
        if b.get("run_type") == "aggregate":
            continue
        name = re.sub(r"/(iterations:\d+|manual_time|real_time)", "", b.get("run_name", b["name"]))
        for k, v in b.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                rows[name][k].append(v)
        if "items_per_second" in b and not name.startswith("BM_EndToEnd"):
            rows[name]["ns"].append(1e9 / b["items_per_second"])

    def med(name, key):
        v = rows[name].get(key)
        return statistics.median(v) if v else None

    def rng(name, key, scale, fmt):
        v = rows[name].get(key)
        if not v or len(v) < 2:
            return ""
        return f" [{fmt.format(min(v) / scale)}–{fmt.format(max(v) / scale)}]"

    reps = min(len(r["real_time"]) for r in rows.values())
    print(f"\nMedians of {reps} repetitions.")

    print("\n### BM_BatcherDecide: CPU ns per decision\n")
    print("| config | ns |")
    print("|---|---:|")
    for n in sorted(n for n in rows if n.startswith("BM_BatcherDecide/")):
        print(f"| {n.split('/', 1)[1]} | {med(n, 'ns'):.1f} |")

    print("\n### BM_QosPick: CPU ns per pick (Pop + Push, 1,024 queued)\n")
    ref = "BM_QosPick/priority_queue"
    print("| config | ns | vs priority_queue |")
    print("|---|---:|---:|")
    for n in sorted((n for n in rows if n.startswith("BM_QosPick/")), key=lambda n: med(n, "ns")):
        ratio = "" if n == ref or ref not in rows else f"{med(n, 'ns') / med(ref, 'ns'):.2f}x"
        print(f"| {n.split('/', 1)[1]} | {med(n, 'ns'):.1f} | {ratio} |")

    for family, title in (
            ("BM_EndToEnd", "as fast as one publisher goes, 300,000 events"),
            ("BM_EndToEndPaced", "paced at 20,000 events/s, 20,000 events")):
        names = [n for n in rows if n.split("/")[0] == family]
        if not names:
            continue
        paced = family == "BM_EndToEndPaced"
        print(f"\n### {family}: {title}\n")
        print("inferq vs this: " + (
            "the row's p99 over inferq's (above 1: inferq is better), and the row's CPU "
            "per event over inferq's" if paced else
            "inferq's events/s over the row's (above 1: inferq is faster)") +
              ", inferq with the same number of members. [min–max] of the repetitions.\n")
        print("| members | impl | events/s | p50 µs | p99 µs | CPU ns/event | events/pull | "
              "inferq vs this |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|")
        by_members = collections.defaultdict(list)
        for n in names:
            _, impl, m = n.split("/")
            by_members[int(m.split(":")[1])].append((impl, n))
        bad = []
        for m in sorted(by_members):
            ref = f"{family}/inferq/members:{m}"
            key = (lambda x: med(x[1], "p99_ns")) if paced else (lambda x: -med(x[1], "items_per_second"))
            for impl, n in sorted(by_members[m], key=key):
                if (med(n, "lost") or 0) > 0 or (med(n, "bad_checksum") or 0) > 0:
                    bad.append(n)
                if n == ref or ref not in rows:
                    ratio = ""
                elif paced:
                    ratio = (f"{med(n, 'p99_ns') / med(ref, 'p99_ns'):.2f}x p99, "
                             f"{med(n, 'cpu_ns_per_event') / med(ref, 'cpu_ns_per_event'):.2f}x CPU")
                else:
                    ratio = f"{med(ref, 'items_per_second') / med(n, 'items_per_second'):.2f}x"
                print(f"| {m} | {impl} "
                      f"| {med(n, 'items_per_second') / 1e3:,.0f} k"
                      f"{'' if paced else rng(n, 'items_per_second', 1e3, '{:,.0f}')} "
                      f"| {med(n, 'p50_ns') / 1e3:,.1f} "
                      f"| {med(n, 'p99_ns') / 1e3:,.0f}{rng(n, 'p99_ns', 1e3, '{:,.0f}')} "
                      f"| {med(n, 'cpu_ns_per_event'):,.0f} "
                      f"| {med(n, 'mean_batch'):.1f} "
                      f"| {ratio} |")
        if bad:
            print(f"\n**lost or bad checksum in: {', '.join(bad)}**")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench_engine.json")

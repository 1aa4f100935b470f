#!/usr/bin/env python3
"""Turns a bench_state JSON file (--benchmark_format=json; with repetitions, the
medians are used) into the Markdown tables of BENCHMARKS.md: commit throughput and
latency per durability class and thread count with inferq's ratio to the best peer,
recovery times with ratios, and checkpoint sizes.

usage: benchmarks/report_state.py bench_state.json
"""
import collections
import json
import re
import sys

DURABLE = {"inferq/every", "inferq/group", "rocksdb/sync", "sqlite/full"}


def medians(data):
    """name -> benchmark entry (the median aggregate when there are repetitions)."""
    out = {}
    for b in data["benchmarks"]:
        agg = b.get("aggregate_name")
        if agg not in (None, "median"):
            continue
        name = re.sub(r"/(iterations:\d+|manual_time|real_time)", "", b["run_name"])
        out[name] = b
    return out


def commit_tables(m):
    by_threads = collections.defaultdict(dict)  # (durable, threads) -> impl -> entry
    for name, b in m.items():
        if not name.startswith("BM_Commit/"):
            continue
        _, impl, policy, threads = name.split("/")
        key = f"{impl}/{policy}"
        by_threads[(key in DURABLE, threads.split(":")[1])][key] = b
    for (durable, threads) in sorted(by_threads, key=lambda k: (not k[0], int(k[1]))):
        rows = by_threads[(durable, threads)]
        peers = {k: v for k, v in rows.items() if not k.startswith("inferq/")}
        best_rate = max(peers.items(), key=lambda kv: kv[1]["commits_per_s"])
        best_p99 = min(peers.items(), key=lambda kv: kv[1]["p99_us"])
        kind = "durable (survives power loss)" if durable else "survives a process crash only"
        print(f"\n### Commits, {kind}, {threads} committing thread(s)\n")
        print("| config | commits/s | p50 µs | p99 µs | commits per fdatasync | vs best peer (commits/s) |")
        print("|---|---:|---:|---:|---:|---:|")
        for k, b in sorted(rows.items(), key=lambda kv: -kv[1]["commits_per_s"]):
            ratio = f"{b['commits_per_s'] / best_rate[1]['commits_per_s']:.2f}x" if k.startswith("inferq/") else ""
            per_sync = f"{b['commits_per_sync']:.1f}" if "commits_per_sync" in b else ""
            print(f"| {k} | {b['commits_per_s']:,.0f} | {b['p50_us']:.0f} | {b['p99_us']:.0f} | {per_sync} | {ratio} |")
        print(f"\nBest peer: {best_rate[0]} ({best_rate[1]['commits_per_s']:,.0f}/s); "
              f"lowest peer p99: {best_p99[0]} ({best_p99[1]['p99_us']:.0f} µs).")


def recovery_table(m):
    rows = {n: b for n, b in m.items() if n.startswith("BM_Recover/")}
    if not rows:
        return
    sqlite = rows.get("BM_Recover/sqlite/reopen+select")
    floor = rows.get("BM_Recover/plain_snapshot/hash_map")
    print("\n### Recovery of 100,000 keys after 100,000 creates and 200,000 updates (ms)\n")
    print("| how | ms | log records replayed | checkpoints read | vs SQLite | vs plain-snapshot floor |")
    print("|---|---:|---:|---:|---:|---:|")
    for n, b in sorted(rows.items(), key=lambda kv: kv[1]["real_time"]):
        ms = b["real_time"]
        vs_sqlite = f"{ms / sqlite['real_time']:.2f}x" if sqlite else ""
        vs_floor = f"{ms / floor['real_time']:.2f}x" if floor else ""
        records = f"{b['log_records']:,.0f}" if "log_records" in b else ""
        ckpts = f"{b['checkpoints']:.0f}" if "checkpoints" in b else ""
        print(f"| {n[len('BM_Recover/'):]} | {ms:.0f} | {records} | {ckpts} | {vs_sqlite} | {vs_floor} |")


def checkpoint_table(m):
    rows = {n: b for n, b in m.items() if n.startswith("BM_Checkpoint/")}
    if not rows:
        return
    print("\n### Checkpoints of that state\n")
    print("| checkpoint | ms (write + fsync) | bytes | bytes of changed keys+values | size ratio |")
    print("|---|---:|---:|---:|---:|")
    for n, b in sorted(rows.items()):
        changed = f"{b['changed_bytes']:,.0f}" if "changed_bytes" in b else ""
        ratio = f"{b['size_ratio']:.2f}" if "size_ratio" in b else ""
        print(f"| {n[len('BM_Checkpoint/'):]} | {b['real_time']:.0f} | {b['bytes']:,.0f} | {changed} | {ratio} |")


def main(path):
    m = medians(json.load(open(path)))
    commit_tables(m)
    recovery_table(m)
    checkpoint_table(m)


if __name__ == "__main__":
    main(sys.argv[1])

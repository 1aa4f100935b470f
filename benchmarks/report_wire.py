#!/usr/bin/env python3
"""Turns a bench_wire JSON file (--benchmark_format=json, with repetitions) into the
Markdown tables of BENCHMARKS.md: the median over the repetitions of

  BM_Encode / BM_Decode      CPU ns per event for each implementation, codec and payload
                             size, the encoded bytes, and tensor_event against each peer
                             (tensor_event's ns over the peer's: above 1, the peer is
                             faster);
  BM_Compress / BM_Decompress  MB/s of uncompressed payload for each implementation, data
                             set and level, the zstd ratio (payload bytes / compressed
                             bytes; wire_ratio: whole TensorEvents, codec none over zstd),
                             and each peer's MB/s over tensor_event's.

Runs that report an error (SkipWithError) are listed and left out.

usage: benchmarks/report_wire.py bench_wire.json
"""
import collections
import json
import statistics
import sys


def main(path):
    rows = collections.defaultdict(lambda: collections.defaultdict(list))
    errors = set()
    for b in json.load(open(path))["benchmarks"]:
        if b.get("run_type") == "aggregate":
            continue
        name = b.get("run_name", b["name"])
        if b.get("error_occurred"):
            errors.add(f"{name}: {b.get('error_message', '')}")
            continue
        for k, v in b.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                rows[name][k].append(v)

    def med(name, key):
        v = rows.get(name, {}).get(key)
        return statistics.median(v) if v else None

    def ns(name):
        # cpu_time is in the benchmark's time_unit; items_per_second gives ns per item
        # whatever the unit.
        ips = med(name, "items_per_second")
        return 1e9 / ips if ips else None

    reps = min(len(r["cpu_time"]) for r in rows.values()) if rows else 0
    print(f"\nMedians of {reps} repetitions (CPU time).")

    # BM_Encode/<impl>/codec:<c>/payload:<n>
    impls = ["tensor_event", "memcpy_frame", "memcpy_frame_zctx"]
    for what in ("BM_Encode", "BM_Decode"):
        configs = sorted({tuple(n.split("/")[2:]) for n in rows if n.split("/")[0] == what},
                         key=lambda c: (int(c[1].split(":")[1]), c[0]))
        if not configs:
            continue
        print(f"\n### {what}: CPU ns per event\n")
        print("tensor_event vs peer: tensor_event's ns over the peer's (above 1: the peer is "
              "faster). Bytes: the encoded event, tensor_event / memcpy_frame.\n")
        print("| payload B | codec | tensor_event | memcpy_frame | memcpy_frame_zctx | "
              "vs memcpy_frame | vs memcpy_frame_zctx | bytes |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|")
        for codec, payload in configs:
            cells = {i: ns(f"{what}/{i}/{codec}/{payload}") for i in impls}
            ours = cells["tensor_event"]

            def fmt(v):
                return "–" if v is None else f"{v:,.0f}"

            def ratio(peer):
                v = cells[peer]
                return "" if ours is None or v is None else f"{ours / v:.2f}x"

            wb_ours = med(f"{what}/tensor_event/{codec}/{payload}", "wire_bytes")
            wb_peer = med(f"{what}/memcpy_frame/{codec}/{payload}", "wire_bytes")
            bytes_cell = f"{wb_ours:,.0f} / {wb_peer:,.0f}" if wb_ours and wb_peer else ""
            print(f"| {int(payload.split(':')[1]):,} | {codec.split(':')[1]} "
                  f"| {fmt(ours)} | {fmt(cells['memcpy_frame'])} "
                  f"| {fmt(cells['memcpy_frame_zctx'])} "
                  f"| {ratio('memcpy_frame')} | {ratio('memcpy_frame_zctx')} | {bytes_cell} |")

    # BM_Compress/<impl>/data:<d>/level:<l>
    cimpls = ["tensor_event", "zstd_codec", "zstd_ctx_reused"]
    for what in ("BM_Compress", "BM_Decompress"):
        configs = sorted({tuple(n.split("/")[2:]) for n in rows if n.split("/")[0] == what})
        if not configs:
            continue
        print(f"\n### {what}: MB/s of uncompressed payload, one event at a time\n")
        print("peer vs tensor_event: the peer's MB/s over tensor_event's (above 1: the peer "
              "is faster). ratio: payload bytes / zstd bytes; wire ratio: TensorEvents with "
              "codec none / with zstd.\n")
        print("| data | level | tensor_event | zstd_codec | zstd_ctx_reused | "
              "zstd_codec vs tensor_event | zstd_ctx_reused vs tensor_event | ratio | "
              "wire ratio |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for data, level in configs:
            mbs = {}
            for i in cimpls:
                v = med(f"{what}/{i}/{data}/{level}", "bytes_per_second")
                mbs[i] = None if v is None else v / 1e6

            def fmt(v):
                return "–" if v is None else f"{v:,.0f}"

            def ratio(peer):
                ours, v = mbs["tensor_event"], mbs[peer]
                return "" if ours is None or v is None else f"{v / ours:.2f}x"

            r = med(f"{what}/zstd_codec/{data}/{level}", "ratio")
            wr = med(f"BM_Compress/tensor_event/{data}/{level}", "wire_ratio")
            print(f"| {data.split(':')[1]} | {level.split(':')[1]} "
                  f"| {fmt(mbs['tensor_event'])} | {fmt(mbs['zstd_codec'])} "
                  f"| {fmt(mbs['zstd_ctx_reused'])} | {ratio('zstd_codec')} "
                  f"| {ratio('zstd_ctx_reused')} "
                  f"| {'' if r is None else f'{r:.3f}'} | {'' if wr is None else f'{wr:.3f}'} |")

    if errors:
        print("\n**runs with errors, left out:**\n")
        for e in sorted(errors):
            print(f"- {e}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench_wire.json")

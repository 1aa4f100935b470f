#!/usr/bin/env python3
"""Where the CPU time of a bench_routing_peers run goes, per event, from a perf
profile: each sample is put in one bucket by its innermost frame (the source file of
inlined code counts, so a ring push inlined into Engine::Publish is "ring"), kernel
samples by the system call or fault they serve. Times are CPU ns per published event
(samples / frequency / events), per thread group (publisher, subscribers).

usage:
  perf record -F 4000 -g -o perf.data -- \\
      build/bench-prof/benchmarks/bench_routing_peers --benchmark_filter='...'
  perf script -i perf.data -F comm,ip,sym,srcline > perf.txt   # slow: minutes
  benchmarks/perf_breakdown.py perf.txt --events 2000000 --freq 4000

The thread names (publisher, subscriber<i>) are set by the benchmark. Buckets are an
approximation: a sample lands on the instruction after a stalled one (skid), so a
cache miss on a load is charged to the line that follows it.
"""
import argparse
import collections
import re


def parse(path):
    """Yields (comm, [(sym, file)]) per sample, innermost frame first."""
    comm, frames, pending_sym = None, [], None
    for line in open(path, errors="replace"):
        if not line.strip():
            continue
        if not line[0].isspace():  # sample header: the comm
            if comm is not None:
                yield comm, frames
            comm, frames, pending_sym = line.split()[0], [], None
            continue
        text = line.strip()
        if line.startswith("\t"):  # "<addr> <sym>"
            parts = text.split(None, 1)
            pending_sym = parts[1] if len(parts) > 1 else "[unknown]"
            frames.append([pending_sym, ""])
        elif frames:  # srcline of the last frame
            frames[-1][1] = re.sub(r":\d+$", "", text)
    if comm is not None:
        yield comm, frames


def is_kernel(frame):
    return "kernel.kallsyms" in frame[1]


def bucket(frames):
    if not frames:
        return "unknown"
    if is_kernel(frames[0]):
        syms = " ".join(s for s, _ in frames)
        user = next((f for f in frames if not is_kernel(f)), ("", ""))
        if "page_fault" in syms:
            return "kernel: page faults (pool growth, first touch)"
        if "sched_yield" in syms:
            return "kernel: sched_yield (wait strategy)"
        if "nanosleep" in syms:
            return "kernel: clock_nanosleep (pacing)"
        if "futex" in syms:
            if "lowlevellock" in user[1] or "pthread_mutex" in user[1] or "lll_lock" in user[0]:
                return "kernel: futex of the stream mutex"
            return "kernel: futex wait/wake (ring event count, sockets)"
        if any(k in syms for k in ("poll", "eventfd", "sys_read", "sys_write", "recvfrom", "sendto")):
            return "kernel: poll/eventfd (socket signalling)"
        return "kernel: other (scheduler, interrupts, syscall entry)"
    sym, f = frames[0]
    f = f.split("/")[-1]
    if "clock_gettime" in sym or f in ("clock_gettime.c", "clock.hpp") or sym.startswith("__vdso"):
        return "clock reads (clock_gettime)"
    if f in ("fixed_pool.cpp", "fixed_pool.hpp", "pool_fast_path.hpp") or re.search(
            r"FixedPool|CacheFor|BufferPoolFor|PoolAllocate|PoolDeallocate", sym):
        return "FixedPool allocate/free (Event, StoredMessage, payload)"
    if f == "histogram.hpp":
        return "histogram recording"
    if f == "mpmc_ring.hpp":
        return "ring push/pop"
    if f == "event_count.hpp" or "WaitUntil" in sym:
        return "ring wait/notify (spin, fences, event count)"
    if f in ("syscall-template.S", "syscall.S", "futex-internal.h") or sym in ("syscall", "__sched_yield"):
        return "syscall entry (futex, sched_yield)"
    if f in ("lowlevellock.c", "pthread_mutex_lock.c", "pthread_mutex_unlock.c", "std_mutex.h",
             "gthr-default.h") or "pthread_mutex" in sym:
        return "stream mutex lock/unlock"
    if f in ("subject.cpp",) or re.search(r"SubjectPattern|Validate", sym):
        return "subject validation + matching"
    if "memcmp" in sym or f in ("string_view", "char_traits.h"):
        caller = next((s for s, _ in frames[1:] if "memcmp" not in s and "plt" not in s), "")
        if "Publish" in caller or "Subject" in caller or "Validate" in caller:
            return "subject validation + matching"
        return "string compare (elsewhere)"
    if f in ("shared_ptr_base.h", "atomicity.h", "shared_ptr.h"):
        return "shared_ptr refcounts / control blocks"
    if f in ("stl_construct.h", "alloc_traits.h", "new_allocator.h"):
        return "allocate_shared: constructing Event / StoredMessage"
    if f == "buffer.hpp":
        return "Buffer: payload copy / release"
    if f in ("event.hpp", "basic_string.h", "basic_string.tcc") or "memmove" in sym or "memcpy" in sym:
        return "Event build / move / destroy (strings, memcpy)"
    if f == "atomic_base.h":
        return "atomics: engine counters, message state"
    if f == "engine.cpp":
        return "engine.cpp own code (Publish, PopOne, NextBatch)"
    if f in ("stl_vector.h", "inlined_vector.h", "stl_iterator.h", "statusor_internal.h",
             "unique_ptr.h", "compressed_tuple.h", "inlined_vector_internal.h", "status.h",
             "stl_algobase.h", "stl_uninitialized.h") or "operator new" in sym or "free" == sym:
        return "containers, StatusOr, vector allocation"
    if f == "bench_routing_peers.cpp" or "pubsub_peers" in sym:
        return "benchmark harness (payload build, checks)"
    if "libzmq" in sym or "zmq" in sym:
        return "libzmq"
    if "nng" in sym or "nni_" in sym:
        return "libnng"
    return "other: " + (sym[:60] if sym != "[unknown]" else f or "[unknown]")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("script")
    ap.add_argument("--events", type=float, required=True, help="events published")
    ap.add_argument("--freq", type=float, default=4000.0, help="perf -F")
    args = ap.parse_args()
    ns_per_sample = 1e9 / args.freq
    groups = collections.defaultdict(collections.Counter)
    for comm, frames in parse(args.script):
        group = "publisher" if comm.startswith("publisher") else (
            "subscribers" if comm.startswith("subscriber") else "other threads")
        groups[group][bucket(frames)] += 1
    total = sum(sum(c.values()) for c in groups.values())
    print(f"{total} samples = {total * ns_per_sample / 1e9:.2f} s CPU = "
          f"{total * ns_per_sample / args.events:.0f} ns per published event\n")
    for group, counts in sorted(groups.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(counts.values())
        print(f"| {group}: {n * ns_per_sample / args.events:.0f} ns/event "
              f"({100 * n / total:.1f} % of samples) | ns/event | % of group |")
        print("|---|---:|---:|")
        for b, c in counts.most_common():
            if 100 * c / n < 0.5:
                continue
            print(f"| {b} | {c * ns_per_sample / args.events:.0f} | {100 * c / n:.1f} |")
        print()


if __name__ == "__main__":
    main()

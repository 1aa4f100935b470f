#!/usr/bin/env python3
"""Where the CPU time of a bench_routing_peers run goes, per event, from a perf
profile. Each sample goes to one bucket: kernel samples by the system call or fault
they serve; user samples by the innermost frame that names a known part (the ring,
the pools, subject matching, ...). With DWARF call graphs perf lists inlined
functions as frames of their own, so a ring push inlined into Engine::Publish counts
as the ring; with frame pointers, the source file of the sampled line (srcline) does
that job. Times are CPU ns per published event (samples / frequency / events), per
thread group (publisher, subscribers, the libraries' own threads).

usage (the bench-prof build adds -g -fno-omit-frame-pointer to the release flags):
  cmake --preset release -B build/bench-prof -DCMAKE_CXX_FLAGS="-g -fno-omit-frame-pointer"
  cmake --build build/bench-prof -j2 --target bench_routing_peers
  perf record -F 2000 --call-graph dwarf,16384 -o perf.data -- \\
      build/bench-prof/benchmarks/bench_routing_peers \\
      --benchmark_filter='BM_PubSub/inferq/stream:one/ret:interest/ack:none/pull:batch'
  perf script -i perf.data -F comm,ip,sym,dso > perf.txt  # add ,srcline for -g (fp) data
  benchmarks/perf_breakdown.py perf.txt --events 2000000 --freq 2000

The thread names (publisher, subscriber<i>) are set by the benchmark. A sample lands
on the instruction after a stalled one (skid): a locked instruction that waits for
the store buffer to drain is charged for the stores before it (e.g. writing a new
Event into memory last touched by another core shows up in the refcount increment
that follows it).
"""
import argparse
import collections
import re


def parse(path):
    """Yields (comm, [[sym, file]]) per sample, innermost frame first."""
    comm, frames = None, []
    for line in open(path, errors="replace"):
        if not line.strip():
            continue
        if not line[0].isspace():  # sample header: the comm
            if comm is not None:
                yield comm, frames
            comm, frames = line.split()[0], []
            continue
        if line.startswith("\t"):  # "<addr> <sym>" or "<addr> <sym> (<dso>)"
            parts = line.strip().split(None, 1)
            sym = parts[1] if len(parts) > 1 else "[unknown]"
            dso = ""
            m = re.match(r"(.*) \(([^()]*)\)$", sym)
            if m and not m.group(1).endswith("inlined"):
                sym, dso = m.group(1), m.group(2)
            frames.append([sym, "[kernel.kallsyms]" if "kernel.kallsyms" in dso else ""])
        elif frames:  # srcline of the last frame
            frames[-1][1] = re.sub(r":\d+$", "", line.strip())
    if comm is not None:
        yield comm, frames


def is_kernel(frame):
    return "kernel.kallsyms" in frame[1] or frame[0].startswith(("__x64_sys", "do_syscall",
                                                                  "entry_SYSCALL"))


# (bucket, source files, symbol pattern). For each frame, innermost first, the file
# rules are tried, then the symbol rules; the first frame that matches decides.
RULES = [
    ("clock reads", ("clock_gettime.c", "clock.hpp"),
     r"clock_gettime|steady_clock::now|NowNanos|MonotonicNowNs|SteadyClock|__vdso"),
    ("FixedPool allocate/free (Event, StoredMessage, payload blocks)",
     ("fixed_pool.cpp", "fixed_pool.hpp", "pool_fast_path.hpp"),
     r"FixedPool|PoolAllocator|CacheFor|PoolAllocate|PoolDeallocate|BufferPoolFor|ThreadCache"),
    ("latency histogram (engine)", ("histogram.hpp",), r"inferq::Histogram::Record"),
    ("subject validation + matching", ("subject.cpp",),
     r"SubjectPattern|ValidateSubject|anonymous namespace\)::Validate|StreamState::Captures"),
    ("ring wait/notify (spin, yield, fences, event count)", ("event_count.hpp",),
     r"EventCount|WaitUntil|CpuRelax"),
    ("ring push/pop", ("mpmc_ring.hpp",), r"MpmcRing"),
    ("mutex lock/unlock", ("lowlevellock.c", "pthread_mutex_lock.c", "pthread_mutex_unlock.c",
                           "std_mutex.h"), r"mutex|lll_"),
    ("stream bookkeeping (Retire, TrimFront, CompactIfSparse, counters)", (),
     r"StreamState::|HandleQueue"),
    ("Message::Ack", (), r"Message::Ack"),
    ("Buffer: payload copy / release", ("buffer.hpp",), r"inferq::Buffer"),
    ("Event build / move / destroy (392-byte Event: strings, vectors)",  # memcpy: caller
     ("event.hpp", "basic_string.h", "basic_string.tcc"),
     r"inferq::Event::|Headers|basic_string(?!_view)|~Event|InferqImpl::Publish"),
    ("shared_ptr refcounts / control blocks", ("shared_ptr_base.h", "atomicity.h", "shared_ptr.h"),
     r"shared_ptr|_Sp_counted|__shared_count|__atomic_add|__exchange_and_add"),
    ("containers, Status/StatusOr, batch vector", ("stl_vector.h", "inlined_vector.h",
                                                   "statusor_internal.h", "status.h"),
     r"std::vector|InlinedVector|StatusOr|absl::.*Status|operator new|operator delete|^free$|"
     r"^malloc$|mi_free|mi_malloc"),
    ("engine: Publish / PopOne / NextBatch own code",
     ("engine.cpp", "publish.cpp", "stream_store.cpp", "pull.cpp"),
     r"Engine::Publish|Engine::Impl::|StreamState::Admit|StreamState::Append|"
     r"Member::PopOne|Member::NextBatch|Member::Next"),
    ("benchmark harness (payload, checks, own histogram)", ("bench_routing_peers.cpp",),
     r"pubsub_peers"),
    ("libzmq", (), r"zmq"),
    ("libnng", (), r"nng|nni_"),
]


def kernel_bucket(frames):
    syms = " ".join(s for s, _ in frames)
    if "page_fault" in syms:
        return "kernel: page faults (pool growth, first touch)"
    if "sched_yield" in syms:
        return "kernel: sched_yield (wait strategy)"
    if "nanosleep" in syms:
        return "kernel: clock_nanosleep (pacing)"
    if "futex" in syms:
        users = " ".join(s for s, f in frames if not is_kernel((s, f)))
        if re.search(r"mutex|lll_lock", users):
            owner = "FixedPool global list" if "FixedPool" in users else (
                "stream mutex" if "Publish" in users else "other")
            return f"kernel: futex of a contended mutex ({owner})"
        return "kernel: futex wait/wake (ring event count, NNG condvars)"
    if re.search(r"poll|eventfd|ksys_read|ksys_write", syms):
        return "kernel: poll / eventfd (ZeroMQ signalling)"
    return "kernel: other (scheduler, interrupts, syscall entry)"


def bucket(frames):
    if not frames:
        return "unknown"
    if is_kernel(frames[0]):
        return kernel_bucket(frames)
    for sym, f in frames:
        if is_kernel((sym, f)):
            continue
        base = f.split("/")[-1]
        for name, files, _ in RULES:
            if base in files:
                return name
        # The harness's own code (checks, its histogram), unless it is the adapter
        # that builds the Event for Engine::Publish (what every caller must do).
        if "pubsub_peers" in sym and "InferqImpl::Publish" not in sym:
            return "benchmark harness (payload, checks, own histogram)"
        for name, _, pattern in RULES:
            if re.search(pattern, sym):
                return name
    return "other: " + frames[0][0][:60]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("script")
    ap.add_argument("--events", type=float, required=True, help="events published")
    ap.add_argument("--freq", type=float, required=True, help="perf record -F")
    args = ap.parse_args()
    ns_per_sample = 1e9 / args.freq
    groups = collections.defaultdict(collections.Counter)
    for comm, frames in parse(args.script):
        group = "publisher" if comm.startswith("publisher") else (
            "subscribers" if comm.startswith("subscriber") else "other threads (" + comm + ")")
        groups[group][bucket(frames)] += 1
    total = sum(sum(c.values()) for c in groups.values())
    print(f"{total} samples = {total * ns_per_sample / 1e9:.2f} s CPU = "
          f"{total * ns_per_sample / args.events:.0f} ns per published event\n")
    for group, counts in sorted(groups.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(counts.values())
        if 100 * n / total < 0.5:
            continue
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

#!/usr/bin/env bash
# Installs the Debian 12 packages inferq needs for a purpose, when any is missing.
# Uses sudo when not run as root. Run with --help for the purposes and options.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/install-deps.sh [--for PURPOSE]... [--dry-run] [--help]

Installs (apt-get, --no-install-recommends) the Debian 12 packages of each PURPOSE
that are missing, after printing how many packages apt will install and how much it
will download. dpkg's output goes to a log file, shown only if the install fails.

purposes (default: examples; --for may be given more than once):
  library   compiler, CMake, Ninja and the libraries libinferq builds on: the
            `release` preset (library, tools and examples) and the install
  examples  the same as library: the main example (inference_server) needs
            nothing more; agent_router needs valijson too (the tests purpose)
  tests     library + Catch2, valijson (JSON Schema predicates, which the tests
            check), the JSON Schema test suite, libnats and nats-server (the NATS
            bridge, inferq::nats, and the servers its tests start), the openssl
            tool (the certificates of the bridge's TLS tests), prometheus-cpp and
            the Prometheus server with promtool (the exposition and its checks),
            and libcurl (the OTLP trace exporter, inferq::otlp): the `dev`
            preset and ctest
  bench     library + Google Benchmark and the peers the benchmarks compare
            against (TBB, Boost, atomic_queue, moodycamel, xenium, RocksDB,
            SQLite, ZeroMQ, NNG, NATS JetStream: libnats and nats-server),
            prometheus-cpp (bench_metrics), and valgrind with binutils (the
            instruction counts of benchmarks/instruction_budget.py): the `bench`
            preset
  fuzz      library + clang with its libFuzzer runtime, and valijson: the
            `fuzz` preset
  cluster   library + libnats and nats-server: the main example across
            processes over a NATS JetStream cluster (scripts/cluster_demo.sh)
  metrics   library + prometheus-cpp (the Prometheus exposition,
            inferq::prometheus), the Prometheus server with promtool, and
            libcurl (the OTLP/HTTP trace exporter, inferq::otlp)
  plot      library + python3-matplotlib: scripts/plot_replay.py, which draws a
            replay of the main example from its --json and --timeline files
  docs      library + doxygen: the API reference that the `docs` target makes
            from the headers (cmake --build --preset release --target docs)

options:
  --for PURPOSE, --for=PURPOSE  a purpose above
  --dry-run                     print what would be installed and change nothing:
                                needs no root and does not run apt-get update, so
                                it counts against apt's package lists as they are
  --help, -h                    this text

exit status: 0 installed (or nothing missing); 1 apt-get failed or cannot install a
package, or not root and no sudo; 2 usage.
EOF
}

library=(
  build-essential cmake ninja-build pkg-config
  libabsl-dev libzstd-dev libmimalloc-dev libhwloc-dev libssl-dev libxxhash-dev
  rapidjson-dev libre2-dev flatbuffers-compiler libflatbuffers-dev
)
tests=(
  catch2 libvalijson-dev json-schema-test-suite libnats-dev nats-server openssl prometheus-cpp-dev prometheus
  libcurl4-openssl-dev
)
bench=(
  libbenchmark-dev libtbb-dev libboost-dev libatomic-queue-dev libconcurrentqueue-dev
  libxenium-dev librocksdb-dev libsqlite3-dev libzmq3-dev libnng-dev libnats-dev nats-server
  prometheus-cpp-dev valgrind binutils
)
fuzz=(clang libclang-rt-14-dev libvalijson-dev)
cluster=(libnats-dev nats-server)
metrics=(prometheus-cpp-dev prometheus libcurl4-openssl-dev)
plot=(python3-matplotlib)
docs=(doxygen)

purposes=()
dry_run=0
while [ $# -gt 0 ]; do
  case "$1" in
    --for) if [ $# -lt 2 ] || [ "${2#-}" != "$2" ]; then
             echo "install-deps: --for needs a purpose (library, examples, tests, bench, fuzz, cluster, metrics, plot or docs)${2+, got '$2'}" >&2
             exit 2
           fi
           purposes+=("$2"); shift 2 ;;
    --for=*) purposes+=("${1#--for=}"); shift ;;
    --dry-run) dry_run=1; shift ;;
    --help|-h) usage; exit 0 ;;
    *) echo "install-deps: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#purposes[@]} -gt 0 ] || purposes=(examples)

packages=("${library[@]}")
for p in "${purposes[@]}"; do
  case "$p" in
    library|examples) ;;
    tests) packages+=("${tests[@]}") ;;
    bench) packages+=("${bench[@]}") ;;
    fuzz) packages+=("${fuzz[@]}") ;;
    cluster) packages+=("${cluster[@]}") ;;
    metrics) packages+=("${metrics[@]}") ;;
    plot) packages+=("${plot[@]}") ;;
    docs) packages+=("${docs[@]}") ;;
    *) echo "install-deps: unknown purpose '$p' (library, examples, tests, bench, fuzz, cluster, metrics, plot or docs)" >&2
       exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    case " ${missing[*]} " in *" $p "*) ;; *) missing+=("$p") ;; esac
  fi
done
what="install-deps (${purposes[*]})"
if [ ${#missing[@]} -eq 0 ]; then
  echo "$what: all packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ] && [ "$dry_run" -eq 0 ]; then
  if ! command -v sudo > /dev/null; then
    echo "$what: missing ${missing[*]}" >&2
    echo "$what: installing needs root, and sudo is not installed: run this as root" >&2
    exit 1
  fi
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
echo "$what: missing ${missing[*]}"
fail() {  # apt's own message is above; exit 1 as --help says
  echo "$what: $1" >&2
  exit 1
}
if [ "$dry_run" -eq 0 ]; then
  $sudo apt-get update -qq || fail "apt-get update failed"
elif ! compgen -G "/var/lib/apt/lists/*_Packages*" > /dev/null; then
  # As in a container image: nothing to count against.
  fail "apt has no package lists (/var/lib/apt/lists), so --dry-run cannot count; run apt-get update (as root) first"
fi
# What apt will fetch: one line per package to download, its size in the third field.
# (Packages already in apt's cache count as installed but not downloaded.) Both
# queries are simulations, which need no root.
plan=$(apt-get install -y --no-install-recommends --print-uris -qq "${missing[@]}") ||
  fail "apt-get cannot install ${missing[*]}$([ "$dry_run" -eq 1 ] && echo " (--dry-run uses apt's package lists as they are: run apt-get update first if they are empty)")"
sim=$(apt-get install -s --no-install-recommends "${missing[@]}") || fail "apt-get cannot install ${missing[*]}"
# "Inst <pkg> (<version> ...)" is a new package, "Inst <pkg> [<installed>] (...)" an
# upgrade of one the machine has (a newer version a dependency needs).
count=$(printf '%s\n' "$sim" | grep -cE '^Inst [^ ]+ \(' || true)
upgrades=$(printf '%s\n' "$sim" | grep -cE '^Inst [^ ]+ \[' || true)
bytes=$(printf '%s\n' "$plan" | awk '/^'"'"'/ {s += $3} END {printf "%d", s}')
mb=$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1e6}')
if [ "$upgrades" -gt 0 ]; then
  echo "$what: apt will install $count new packages and upgrade $upgrades installed ones, $mb MB to download"
else
  echo "$what: apt will install $count new packages, $mb MB to download"
fi
if [ "$dry_run" -eq 1 ]; then exit 0; fi
log=$(mktemp "${TMPDIR:-/tmp}/inferq-install-deps.XXXXXX.log")
echo "$what: installing (dpkg's output: $log)"
if ! $sudo apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 "${missing[@]}" \
    > "$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "$what: apt-get install failed; the whole output is in $log" >&2
  exit 1
fi
echo "$what: done"

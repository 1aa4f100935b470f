#!/usr/bin/env bash
# The main example across processes: installs what is missing (libnats, nats-server),
# builds Release, then starts a 3-node NATS JetStream cluster on free loopback ports,
# 2 replica processes and 1 client, replays 2,000 requests of the bundled Azure trace,
# prints the client's table and each replica's summary, and stops everything.
# Extra arguments go to cluster_demo, e.g. --kill-replica 1@120 or --outage 100:3.
set -euo pipefail
cd "$(dirname "$0")/.."
demo=./build/release/examples/inference_server/cluster_demo
if [ "${1-}" = "--help" ] || [ "${1-}" = "-h" ]; then
  cat <<'USAGE'
usage: scripts/cluster_demo.sh [cluster_demo options]

Installs the Debian packages the demo needs (scripts/install-deps.sh --for cluster),
builds the `release` preset's inference_server and cluster_demo, and runs
cluster_demo --limit 2000 --speed 5 with the options given (a later --limit or
--speed wins). The replay takes about two minutes; on a fresh machine the package
install and the build before it take about four more (2 vCPUs). cluster_demo's own
options (--servers, --replica-processes, --replicas, --limit, --speed, --json,
--kill-node, --kill-replica, --outage, --timeout, --inference-server) are described below.
Exit status: the client's (0: every request completed, no token lost), 1 when a
replica process that was not killed failed, or the failing step's.
USAGE
  echo
  if [ -x "$demo" ]; then
    "$demo" --help
  else
    echo "cluster_demo is not built yet, so its descriptions cannot be shown. This builds it"
    echo "(after scripts/install-deps.sh --for cluster), then --help shows them:"
    echo "  cmake --preset release && cmake --build --preset release --target inference_server cluster_demo"
  fi
  exit 0
fi
./scripts/install-deps.sh --for cluster
cmake --preset release
cmake --build --preset release --target inference_server cluster_demo
exec "$demo" --limit 2000 --speed 5 "$@"

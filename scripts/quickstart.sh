#!/usr/bin/env bash
# README command 1: install what is missing, build Release, and replay the bundled
# Azure LLM trace through inferq (one hour of trace in about a minute).
# Extra arguments go to inference_server, e.g. --speed 0 or --limit 2000.
set -euo pipefail
cd "$(dirname "$0")/.."
example=./build/release/examples/inference_server/inference_server
if [ "${1-}" = "--help" ] || [ "${1-}" = "-h" ]; then
  cat <<'USAGE'
usage: scripts/quickstart.sh [inference_server options]

Installs the Debian packages the examples need (scripts/install-deps.sh), builds the
`release` preset's inference_server and replays the bundled Azure LLM trace with it.
Options are passed to inference_server (e.g. --speed 0, --limit 2000).
Exit status: inference_server's (0: every request completed, nothing lost), or the
failing step's.
USAGE
  if [ -x "$example" ]; then
    echo
    "$example" --help
  else
    echo
    echo "(inference_server's options are listed here once it is built: run this script"
    echo " once, or build it alone with"
    echo "   ./scripts/install-deps.sh && cmake --preset release && cmake --build --preset release --target inference_server"
    echo " and see $example --help)"
  fi
  exit 0
fi
./scripts/install-deps.sh
cmake --preset release
cmake --build --preset release --target inference_server
exec "$example" "$@"

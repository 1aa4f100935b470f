#!/usr/bin/env bash
# README command 1: install what is missing, build Release, and replay the bundled
# Azure LLM trace through inferq (one hour of trace in about a minute).
# Extra arguments go to inference_server, e.g. --speed 0 or --limit 2000.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake --preset release
cmake --build --preset release --target inference_server
exec ./build/release/examples/inference_server/inference_server "$@"

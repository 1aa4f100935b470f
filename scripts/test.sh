#!/usr/bin/env bash
# README command 2: install what is missing, build (Debug, with tests) and run every
# test: unit and contract tests, and the FetchContent and find_package consumers.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh --for tests
cmake --preset dev
cmake --build --preset dev
ctest --preset dev -j "$(nproc)"

#!/usr/bin/env bash
# README command 2: install what is missing, build (Debug, with tests) and run every
# test: unit and contract tests, and the FetchContent and find_package consumers.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1-}" in
  "") ;;
  --help|-h)
    cat <<'USAGE'
usage: scripts/test.sh

Installs the Debian packages the tests need (scripts/install-deps.sh --for tests),
builds the `dev` preset (Debug, with tests) and runs every test with ctest.
Exit status: 0 when every test passed, else the failing step's.
USAGE
    exit 0 ;;
  *) echo "test.sh: takes no arguments, got '$1' (see --help)" >&2; exit 2 ;;
esac
./scripts/install-deps.sh --for tests
cmake --preset dev
cmake --build --preset dev
ctest --preset dev -j "$(nproc)"

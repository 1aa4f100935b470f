#!/usr/bin/env bash
# Installs the Debian 12 packages inferq needs to build, test and benchmark, when any
# is missing. Uses sudo when not run as root.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libabsl-dev libzstd-dev zstd libmimalloc-dev libhwloc-dev libssl-dev libxxhash-dev
  catch2 libbenchmark-dev
  libatomic-queue-dev libconcurrentqueue-dev libxenium-dev libboost-dev libtbb-dev
  librocksdb-dev libsqlite3-dev libzmq3-dev libnng-dev clang libclang-rt-14-dev
  rapidjson-dev libvalijson-dev json-schema-test-suite libre2-dev
  flatbuffers-compiler libflatbuffers-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"

#!/usr/bin/env bash
# Downloads the Debian 12 (amd64) packages that deploy/gpu/run-on-gpu.sh
# unpacks on a GPU machine that has CUDA, NCCL and PyTorch but no package
# registry: gRPC, protobuf, Abseil, hiredis, spdlog/fmt, GoogleTest, Google
# Benchmark, Gloo (used only when LibTorch ships none), redis-server,
# pkg-config and gdb, with the libraries they need that an Ubuntu/Debian
# base image lacks. LibTorch, CUDA and NCCL are not here: they come from the GPU
# machine's PyTorch and CUDA installation.
#
# Run it on a Debian 12 amd64 machine that reaches Debian's archive. It
# replaces the .deb files in the folder, writes MANIFEST (package, version,
# file, bytes) and prints the total size, which must stay well under what
# can travel to the GPU machine along with the working tree.
#
# Usage: deploy/gpu/fetch-debs.sh [--dir DIR] [--list]
#   --dir DIR   where the .deb files go (default: .gpu-debs in the repository root)
#   --list      print the package names and exit
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir="$root/.gpu-debs"

# One group per line; run-on-gpu.sh leaves the gloo group out when
# LibTorch ships its own Gloo. Left out on purpose: libc6, libstdc++6,
# libgcc-s1, libatomic1, zlib1g, libssl3, libsystemd0 (present, same
# sonames, on the GPU image); googletest and catch2 (sources and a test
# framework that only the -dev packages' metadata names); ibverbs-providers
# (RDMA drivers; libibverbs1 works without them).
PACKAGES=(
  # Abseil, protobuf, gRPC and the code generators.
  libabsl-dev libabsl20220623
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32 protobuf-compiler
  libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 protobuf-compiler-grpc
  libc-ares-dev libc-ares2 libre2-dev libre2-9
  # Headers and link names whose runtime libraries the GPU image has.
  libssl-dev zlib1g-dev
  # Instruction store and the tests' Redis.
  libhiredis-dev libhiredis0.14 redis-server redis-tools libjemalloc2 liblzf1
  # Logging.
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  # Metrics endpoints (--metrics_listen).
  libcpp-httplib-dev libcpp-httplib0.11 libbrotli-dev libbrotli1
  # Hugging Face checkpoints (safetensors headers, config.json): headers only.
  nlohmann-json3-dev
  # Text datasets: SentencePiece (varipipe-convert-jsonl --tokenizer).
  libsentencepiece-dev libsentencepiece0 sentencepiece
  # Tests and benchmarks.
  libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
  # Gloo (gloo group), for a LibTorch without Gloo headers.
  libgloo-dev libgloo0 libibverbs-dev libibverbs1
  libnl-3-dev libnl-3-200 libnl-route-3-dev libnl-route-3-200
  # pkg-config, for hiredis.
  pkgconf pkgconf-bin libpkgconf3
  # gdb (debugger group): backtraces of crashing checks. Unpacked apart from
  # the prefix, its libraries seen by gdb alone (a wrapper sets its path).
  gdb libbabeltrace1 libdebuginfod1 libipt2 libmpfr6 libsource-highlight4v5 libxxhash0
  libboost-regex1.74.0 libicu72 libelf1 libdw1 libglib2.0-0 libpython3.11 libpython3.11-minimal
)

while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) dir="$2"; shift 2 ;;
    --list) printf '%s\n' "${PACKAGES[@]}"; exit 0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fetch-debs.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

fail() { echo "fetch-debs.sh: $*" >&2; exit 1; }
command -v apt-get > /dev/null || fail "apt-get not found: run this on Debian 12"
[[ "$(dpkg --print-architecture)" == amd64 ]] ||
  fail "this machine is $(dpkg --print-architecture); the GPU machine needs amd64 packages"
if [[ -r /etc/os-release ]]; then
  # shellcheck source=/dev/null
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [[ "$codename" == bookworm ]] ||
    echo "fetch-debs.sh: warning: this is '$codename', not Debian 12 (bookworm); run-on-gpu.sh expects bookworm's versions" >&2
fi
# Package lists: apt-get download needs them (a fresh machine has none).
if ! compgen -G "/var/lib/apt/lists/*_Packages*" > /dev/null; then
  echo "fetch-debs.sh: no package lists yet (apt-get update)"
  apt-get update
fi

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
rm -f "$dir"/*.deb "$dir/MANIFEST"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-debs.sh: downloading ${#PACKAGES[@]} packages into $dir"
# apt-get download writes into the current directory and fails naming any
# package it cannot find.
(cd "$tmp" && apt-get download "${PACKAGES[@]}") > "$tmp/download.log" 2>&1 || {
  cat "$tmp/download.log" >&2
  fail "apt-get download failed (see above; 'apt-get update' refreshes stale lists)"
}

# Plain file names (letters, digits, '.', '-', '_'): Debian's carry '%', '~'
# and '+'. MANIFEST maps each package to its file and version.
{
  echo "# package version file bytes: Debian $(cat /etc/debian_version 2>/dev/null || echo '?') amd64, fetched $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  for pkg in "${PACKAGES[@]}"; do
    files=("$tmp/${pkg}_"*.deb)
    [[ -e "${files[0]}" ]] || fail "no .deb for $pkg after the download"
    name="${pkg//+/x}.deb"
    mv "${files[0]}" "$dir/$name"
    echo "$pkg $(dpkg-deb -f "$dir/$name" Version) $name $(stat -c %s "$dir/$name")"
  done
} > "$dir/MANIFEST"
total=$(awk '!/^#/ {s += $4} END {print s}' "$dir/MANIFEST")
mib=$(awk -v b="$total" 'BEGIN {printf "%.1f", b / 1048576}')
echo "fetch-debs.sh: ${#PACKAGES[@]} packages, $total bytes ($mib MiB) in $dir (MANIFEST lists them)"
if (( total > 48 * 1048576 )); then
  echo "fetch-debs.sh: warning: over 48 MiB; with the working tree this may not fit what travels to the GPU machine" >&2
fi

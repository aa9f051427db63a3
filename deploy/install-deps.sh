#!/usr/bin/env bash
# Installs every Debian package Varipipe needs to build, test and run.
#
# Idempotent: when every package is already installed it prints one line and
# exits without touching apt. Otherwise it runs `apt-get update` once (only
# when an install needs it) and installs the missing packages.
#
# CUDA and NCCL are not installed here: they come with the CUDA Toolkit in its
# standard location (/usr/local/cuda) on GPU machines, and the build works
# without them (see VARIPIPE_WITH_CUDA in CMakeLists.txt).
#
# Usage: deploy/install-deps.sh [--check]
#   --check   only report what is missing; exit 1 if anything is.
set -euo pipefail

PACKAGES=(
  # Toolchain.
  build-essential cmake ninja-build ccache pkg-config git
  # Schemas and services.
  protobuf-compiler libprotobuf-dev libgrpc++-dev protobuf-compiler-grpc
  # Instruction store.
  libhiredis-dev redis-server redis-tools
  # Common libraries.
  libabsl-dev libspdlog-dev libfmt-dev
  # Hugging Face checkpoints: safetensors headers and config.json.
  nlohmann-json3-dev
  # Text datasets: SentencePiece tokenizers (the tests train tiny models
  # with spm_train).
  libsentencepiece-dev sentencepiece
  # Metrics endpoints (--metrics_listen).
  libcpp-httplib-dev
  # Tests and benchmarks; promtool checks the metrics endpoints.
  libgtest-dev libgmock-dev libbenchmark-dev prometheus
  # The evaluation's and the quickstart's plots.
  python3-matplotlib
  # TLS test certificates (planner_security_test).
  openssl
  # Fuzzing (tests/fuzz, the `fuzz` preset): clang with libFuzzer and the
  # sanitizer runtimes, llvm-symbolizer for readable reports.
  clang-14 libclang-rt-14-dev llvm-14
  # Executor: LibTorch, Gloo, torchrun, Open MPI.
  libtorch-dev libgloo-dev python3-torch libopenmpi-dev openmpi-bin
)

check_only=0
case "${1:-}" in
  --check) check_only=1 ;;
  -h|--help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0 ;;
  "") ;;
  *) echo "install-deps.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
esac

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "installed" ]] || missing+=("$pkg")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: missing ${#missing[@]} package(s): ${missing[*]}"
if [[ $check_only -eq 1 ]]; then exit 1; fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then SUDO=(sudo); else
    echo "install-deps: not root and no sudo; install the packages above by hand" >&2
    exit 1
  fi
fi

export DEBIAN_FRONTEND=noninteractive
apt_install() {
  "${SUDO[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
}
# Update the package lists once: first if there are none (a fresh machine),
# otherwise only when installing from the current lists fails.
if ! compgen -G "/var/lib/apt/lists/*_Packages*" >/dev/null; then
  echo "install-deps: no package lists yet (apt-get update)"
  "${SUDO[@]}" apt-get update
  apt_install
elif ! apt_install; then
  echo "install-deps: refreshing package lists (apt-get update)"
  "${SUDO[@]}" apt-get update
  apt_install
fi
echo "install-deps: installed ${missing[*]}"

#!/usr/bin/env bash
# Builds Varipipe on a GPU machine that has CUDA, NCCL and PyTorch but no
# package registry, and runs the GPU checks (docs/gpu.md), one command.
#
#  1. machine: GPU, driver, CUDA, PyTorch, NCCL, glibc, compiler, and how
#     LibTorch carries Gloo and protobuf (machine.txt);
#  2. unpack: the Debian packages of deploy/gpu/fetch-debs.sh into a prefix
#     in the build folder (never over /), their CMake and pkg-config files
#     pointed at the prefix, link names of system libraries repaired;
#  3. configure and build with ninja against PyTorch's LibTorch and NCCL,
#     VARIPIPE_WITH_CUDA=ON, in its own build folder;
#  4. the checks, in order, each PASS, FAIL or SKIP with a note; a failing
#     check never stops the ones after it, and none starts once the time
#     budget is spent.
#
# Everything it writes goes to one results folder: summary.txt (updated
# after every check), run.log, machine.txt, logs/ and, at the end,
# results.tar.gz holding all of them. --compact leaves only summary.txt,
# run.log and results.tar.gz there.
#
# Usage: deploy/gpu/run-on-gpu.sh [options]
#   --out DIR          results folder (default: $OUT when set, else gpu-results)
#   --compact          keep only summary.txt, run.log and results.tar.gz in DIR
#   --checks LIST      comma-separated checks or groups (all, gpu, cpu; default all);
#                      --list-checks names them
#   --list-checks      print the checks and exit
#   --time-budget S    start no check later than S seconds after the start, and
#                      stop running ones then (default 540)
#   --debs DIR         the carried packages and their MANIFEST (default .gpu-debs)
#   --build DIR        build folder; the prefix is DIR/prefix (default build-gpu)
#   --python PATH      Python with PyTorch (default: python3)
#   --torch-dir DIR    folder of TorchConfig.cmake (default: PyTorch's own)
#   --nccl-home DIR    NCCL with include/nccl.h and lib/libnccl.so* (default:
#                      $NCCL_HOME, else PyTorch's nvidia-nccl package)
#   --gloo MODE        auto (default), torch (LibTorch's own Gloo) or debian
#   --jobs N           build jobs (default: cores)
#   --peak-tflops X    the GPU's dense bf16 peak for MFU (default: by GPU name)
#   --skip-build       reuse the build folder and prefix as they are
#   --configure-only   stop after configuring
#   --cpu-smoke        no GPU needed: unpack and configure against a CPU
#                      LibTorch (--torch-dir), CUDA AUTO, then stop
#   --dry-run          print what would run, run nothing
#   -h, --help         this text
# The checks and the exit trap are called by name (run_check, trap).
# shellcheck disable=SC2317
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
started=$(date +%s)

out=${OUT:-}
[[ -n "$out" ]] || out="$root/gpu-results"
compact=0
checks_arg=all
time_budget=540
debs="$root/.gpu-debs"
build="$root/build-gpu"
python=python3
torch_dir=""
nccl_home=${NCCL_HOME:-}
gloo_mode=auto
jobs=$(nproc)
peak_tflops=""
skip_build=0
configure_only=0
cpu_smoke=0
dry_run=0

# name|group|what it checks (in run order; build steps come first).
CHECKS=(
  "gpu-fp32-vs-cpu|gpu|one rank, fp32, the quickstart's multi-task job: losses on cuda:0 (TF32 off) match the CPU run of the same plans"
  "gpu-bf16-train|gpu|the quickstart's multi-task job, one rank on cuda:0 under torchrun, bf16 autocast, 30 iterations: the loss falls"
  "host-syncs|gpu|one steady-state iteration of the quickstart's multi-task job (bf16, one rank) under LibTorch's CUDA synchronisation debug mode: synchronising calls against the executor's 'host reads' (target: at most 2), and the profiler's trace of the next iteration summarised by kernel kind"
  "gpu-tests|gpu|the equivalence cells on cuda:0 (equivalence_test Cuda/*: GPT, T5, LLAMA, each recompute mode, packed, one rank; and cells whose 2 or 4 ranks share the GPU over Gloo; fp32, TF32 off) against the reference; the flash variable-length kernel against the reference kernel (variable_length_attention_test, dispatcher_call_test)"
  "speed|gpu|tokens/s, MFU and interpreter overhead of the default search, packing (under the planner's kernel and under the mask) and token-based, GPT-1.3B-like stack, bf16, maximum length 8,192, FLAN-like and documents mixtures"
  "profile|gpu|varipipe-profile on a hidden-4096 layer up to 8,192 tokens: the cost model (varipipe-plan accepts it) and the layer's MFU from device times"
  "predict|gpu|predicted against measured iteration time of a hidden-4096 GPT job: the analytic model, the profiled cost model, and the profiled model with online calibration (varipipe-ctl status: prediction error p50, p90)"
  "gloo-transport|gpu|Gloo transport unit test on the CUDA build (CPU tensors): shows a clash between two Gloo (or libstdc++) copies"
  "two-ranks-one-gpu-nccl|gpu|two pipeline ranks on cuda:0 with NCCL: a clear refusal (NCCL rejects two ranks on one GPU) or success, never a hang"
  "two-ranks-one-gpu-gloo|gpu|two pipeline ranks on cuda:0 over Gloo (--transport gloo: device buffers staged through host memory): both train every iteration"
  "nccl-allreduce-one-rank|gpu|ncclAllReduce on a one-rank communicator (pending: the NCCL transport skips groups of one)"
  "hf-goldens|gpu|tiny random Llama (untied, tied) and FLAN-T5 models from transformers, saved with their token ids, logits, loss and gradient norms as golden files for the CPU tests (deploy/gpu/hf_goldens.py)"
  "hf-export-loads|gpu|Varipipe exports (tests/data/hf/varipipe-export, varipipe-t5-export) loaded with transformers' LlamaForCausalLM and T5ForConditionalGeneration .from_pretrained: missing, unexpected and mismatched keys, and their losses against the golden ones"
  "layer-timings|gpu|per-micro-batch forward/backward times of GPT-1.3B-like and GPT-6.7B-like layer stacks (executor timings, CUDA_LAUNCH_BLOCKING=1)"
  "equivalence-cpu|cpu|the equivalence tests (equivalence_test, plan_interpreter_test, executor_training_test) on the CUDA build with the GPU hidden"
  "ctest-cpu|cpu|the rest of the CTest suite on the CUDA build with the GPU hidden"
)

usage() { sed -n '2,/^# The checks and the exit trap/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "run-on-gpu.sh: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --compact) compact=1; shift ;;
    --checks) checks_arg="$2"; shift 2 ;;
    --list-checks)
      for c in "${CHECKS[@]}"; do IFS='|' read -r n g d <<< "$c"; printf '%-24s %-4s %s\n' "$n" "$g" "$d"; done
      exit 0 ;;
    --time-budget) time_budget="$2"; shift 2 ;;
    --debs) debs="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    --torch-dir) torch_dir="$2"; shift 2 ;;
    --nccl-home) nccl_home="$2"; shift 2 ;;
    --gloo) gloo_mode="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --peak-tflops) peak_tflops="$2"; shift 2 ;;
    --skip-build) skip_build=1; shift ;;
    --configure-only) configure_only=1; shift ;;
    --cpu-smoke) cpu_smoke=1; configure_only=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (try --help)" ;;
  esac
done
[[ "$time_budget" =~ ^[0-9]+$ ]] || die "--time-budget must be a number of seconds"
[[ "$jobs" =~ ^[0-9]+$ && "$jobs" -ge 1 ]] || die "--jobs must be a positive integer"
case "$gloo_mode" in auto|torch|debian) ;; *) die "--gloo must be auto, torch or debian" ;; esac

# The selected checks, as a space-separated list with spaces around.
selected=" "
IFS=',' read -r -a wanted <<< "$checks_arg"
for w in "${wanted[@]}"; do
  found=0
  for c in "${CHECKS[@]}"; do
    IFS='|' read -r n g _ <<< "$c"
    if [[ "$w" == all || "$w" == "$g" || "$w" == "$n" ]]; then selected+="$n "; found=1; fi
  done
  [[ $found -eq 1 ]] || die "unknown check '$w' (--list-checks names them)"
done
is_selected() { [[ "$selected" == *" $1 "* ]]; }

mkdir -p "$out"
out=$(cd "$out" && pwd)
mkdir -p "$build"
build=$(cd "$build" && pwd)
prefix="$build/prefix"
debugger="$build/debugger"
work="$build/work"
logs="$out/logs"
mkdir -p "$work"
[[ "$dry_run" -eq 1 ]] || { rm -rf "$logs"; mkdir -p "$logs"; }
deadline=$((started + time_budget))
summary="$out/summary.txt"
results=()   # "STATUS|name|seconds|note"
facts=()     # lines for the summary's header

if [[ "$dry_run" -eq 0 ]]; then
  exec > >(tee "$out/run.log") 2>&1
fi
say() { printf '[%s +%4ds] %s\n' "$(date +%H:%M:%S)" "$(( $(date +%s) - started ))" "$*"; }

write_summary() {
  [[ "$dry_run" -eq 0 ]] || return 0
  local p=0 f=0 s=0 r st n sec note
  {
    echo "Varipipe GPU run, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(( $(date +%s) - started )) s so far"
    for r in "${facts[@]}"; do echo "  $r"; done
    echo
    printf '%-6s %-24s %7s  %s\n' status check seconds note
    for r in "${results[@]}"; do
      IFS='|' read -r st n sec note <<< "$r"
      printf '%-6s %-24s %7s  %s\n' "$st" "$n" "$sec" "$note"
      case "$st" in PASS) p=$((p + 1)) ;; FAIL) f=$((f + 1)) ;; *) s=$((s + 1)) ;; esac
    done
    echo
    echo "$p passed, $f failed, $s skipped"
  } > "$summary.tmp"
  mv "$summary.tmp" "$summary"
}
record() {  # STATUS NAME SECONDS NOTE
  local note=${4//$'\n'/ }
  results+=("$1|$2|$3|${note//|//}")
  say "$1 $2 (${3} s): $note"
  write_summary
}

# Packs the results folder at exit, whatever happened.
finish() {
  local rc=$?
  [[ "$dry_run" -eq 0 ]] || exit "$rc"
  write_summary
  sleep 0.5  # let tee flush run.log
  (cd "$out" && tar czf results.tar.gz --exclude=results.tar.gz -- *) 2> /dev/null || true
  if [[ "$compact" -eq 1 ]]; then
    find "$out" -mindepth 1 -maxdepth 1 ! -name summary.txt ! -name run.log \
      ! -name results.tar.gz -exec rm -rf {} +
  fi
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

run_dry() { printf '  $'; printf ' %q' "$@"; printf '\n'; }

# ---------------------------------------------------------------------------
# 1. The machine.
# ---------------------------------------------------------------------------
say "Varipipe GPU run: results in $out, build in $build"
missing=()
need() { command -v "$1" > /dev/null || missing+=("$2"); }
need c++ "a C++ compiler (c++; g++ 10 or newer)"
need cmake "cmake (3.25 or newer)"
need ninja "ninja"
need nm "nm (binutils)"
need dpkg-deb "dpkg-deb (dpkg)"
need tar "tar"
if [[ "$cpu_smoke" -eq 0 ]]; then
  need nvidia-smi "nvidia-smi (the NVIDIA driver)"
  need "$python" "$python (Python with PyTorch; --python)"
fi

# PyTorch's facts, as KEY=VALUE lines (empty when there is no PyTorch).
torch_facts=""
if command -v "$python" > /dev/null; then
  torch_facts=$("$python" - 2> "$work/torch-facts.err" << 'EOF' || true
import glob, os, site
try:
    import torch
except Exception as e:  # no PyTorch
    print(f"error=import torch: {e}")
    raise SystemExit(0)
root = os.path.dirname(torch.__file__)
print(f"version={torch.__version__}")
print(f"cuda={torch.version.cuda}")
print(f"root={root}")
print(f"cmake_prefix={torch.utils.cmake_prefix_path}")
print(f"cxx11_abi={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
ok = torch.cuda.is_available()
print(f"cuda_available={int(ok)}")
if ok:
    p = torch.cuda.get_device_properties(0)
    print(f"device_name={p.name}")
    print(f"device_count={torch.cuda.device_count()}")
    print(f"capability={p.major}.{p.minor}")
    print(f"device_memory_gib={p.total_memory / 2**30:.1f}")
try:
    print("torch_nccl=" + ".".join(map(str, torch.cuda.nccl.version())))
except Exception:
    pass
# NCCL of PyTorch's nvidia-nccl package: the one its libtorch_cuda loads.
dirs = []
try:
    import nvidia.nccl
    dirs += list(nvidia.nccl.__path__)
except Exception:
    pass
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    dirs += glob.glob(os.path.join(sp, "nvidia", "*"))
for d in dirs:
    headers = glob.glob(os.path.join(d, "**", "nccl.h"), recursive=True)
    libs = sorted(glob.glob(os.path.join(d, "**", "libnccl.so*"), recursive=True))
    if headers and libs:
        print(f"nccl_include={os.path.dirname(headers[0])}")
        print(f"nccl_library={libs[0]}")
        break
EOF
)
fi
tf() { sed -n "s/^$1=//p" <<< "$torch_facts" | head -n 1; }

[[ -n "$torch_dir" ]] || { [[ -n "$(tf cmake_prefix)" ]] && torch_dir="$(tf cmake_prefix)/Torch"; }
torch_root=$(tf root)
[[ -n "$torch_dir" && -f "$torch_dir/TorchConfig.cmake" ]] ||
  missing+=("LibTorch's TorchConfig.cmake (PyTorch in $python, or --torch-dir; got '${torch_dir:-none}')")

# NCCL: --nccl-home / NCCL_HOME, else the pip package PyTorch uses.
nccl_include=""
nccl_library=""
if [[ -n "$nccl_home" ]]; then
  nccl_include="$nccl_home/include"
  nccl_library=$(find "$nccl_home/lib" "$nccl_home/lib64" -maxdepth 1 -name 'libnccl.so*' 2> /dev/null | sort | head -n 1 || true)
else
  nccl_include=$(tf nccl_include)
  nccl_library=$(tf nccl_library)
  # Else an NCCL installed into CUDA's folder.
  if [[ -z "$nccl_library" && -f /usr/local/cuda/include/nccl.h ]]; then
    nccl_include=/usr/local/cuda/include
    nccl_library=$(find /usr/local/cuda/lib64 /usr/local/cuda/lib -maxdepth 1 -name 'libnccl.so*' 2> /dev/null | sort | head -n 1 || true)
  fi
fi
if [[ "$cpu_smoke" -eq 0 ]]; then
  [[ -f "$nccl_include/nccl.h" && -n "$nccl_library" ]] ||
    missing+=("NCCL (nccl.h and libnccl.so*: --nccl-home, NCCL_HOME or PyTorch's nvidia-nccl package)")
  [[ -x /usr/local/cuda/bin/nvcc ]] || missing+=("the CUDA Toolkit in /usr/local/cuda (nvcc)")
  [[ "$(tf cuda_available)" == 1 ]] || missing+=("a GPU that PyTorch sees (torch.cuda.is_available() is false: $(tf error))")
fi
[[ -f "$debs/MANIFEST" ]] || missing+=("the carried packages: $debs/MANIFEST (run deploy/gpu/fetch-debs.sh where Debian's archive is reachable, and carry that folder)")

# Gloo and protobuf inside LibTorch: headers shipped, symbols exported.
torch_cpu_lib=""
[[ -n "$torch_root" ]] && torch_cpu_lib="$torch_root/lib/libtorch_cpu.so"
[[ -z "$torch_root" && -n "$torch_dir" ]] && torch_cpu_lib=$(find "$torch_dir/../../.." -maxdepth 2 -name libtorch_cpu.so 2> /dev/null | head -n 1 || true)
gloo_headers=0
gloo_symbols=0
protobuf_symbols=0
if [[ -n "$torch_root" && -f "$torch_root/include/gloo/transport/tcp/device.h" ]]; then gloo_headers=1; fi
if [[ -n "$torch_cpu_lib" && -f "$torch_cpu_lib" ]] && command -v nm > /dev/null; then
  nm -D --defined-only "$torch_cpu_lib" 2> /dev/null | awk '{print $NF}' > "$work/torch_cpu.symbols" || true
  gloo_symbols=$(grep -c '^_ZN4gloo' "$work/torch_cpu.symbols" || true)
  protobuf_symbols=$(grep -c '^_ZN6google8protobuf' "$work/torch_cpu.symbols" || true)
fi
if [[ "$gloo_mode" == auto ]]; then
  if [[ "$gloo_headers" -eq 1 && "$gloo_symbols" -gt 0 ]]; then gloo_mode=torch; else gloo_mode=debian; fi
fi

glibc=$(getconf GNU_LIBC_VERSION 2> /dev/null || ldd --version 2> /dev/null | head -n 1 || echo unknown)
# Debian 12's binaries need glibc 2.36 at most.
glibc_version=$(grep -oE '[0-9]+\.[0-9]+' <<< "$glibc" | tail -n 1 || true)
if [[ -n "$glibc_version" ]] &&
   ! printf '2.36\n%s\n' "$glibc_version" | sort -V -C; then
  missing+=("glibc 2.36 or newer for Debian 12's libraries (found $glibc_version)")
fi
gpu_line=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2> /dev/null | head -n 1 || true)
nvcc_version=$(/usr/local/cuda/bin/nvcc --version 2> /dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' || true)
cmake_version=$(cmake --version 2> /dev/null | sed -n '1s/[^0-9]*//p' || true)
if [[ -n "$(tf version)" ]]; then
  torch_line="PyTorch $(tf version) for CUDA $(tf cuda), C++11 ABI $(tf cxx11_abi), NCCL $(tf torch_nccl)"
  [[ "$(tf cuda_available)" == 1 ]] && gpu_line+=" (PyTorch sees $(tf device_count): $(tf device_name), compute capability $(tf capability))"
else
  torch_line="no PyTorch in $python ($(tf error))"
fi
facts+=("GPU: ${gpu_line:-none}")
facts+=("CUDA ${nvcc_version:-not found} (nvcc); $torch_line; NCCL for the build: ${nccl_library:-not found}")
os_name=$(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2> /dev/null | tr -d '"')
facts+=("${os_name:-unknown OS}, $glibc, $(c++ --version 2> /dev/null | head -n 1), cmake $cmake_version, ninja $(ninja --version 2> /dev/null), $(nproc) cores")
facts+=("LibTorch: ${torch_dir:-not found}; Gloo: $gloo_mode (headers in LibTorch: $gloo_headers, gloo symbols exported by libtorch_cpu: $gloo_symbols); protobuf symbols exported by libtorch_cpu: $protobuf_symbols")
if commit=$(git -C "$root" rev-parse --short HEAD 2> /dev/null); then
  git -C "$root" diff --quiet HEAD 2> /dev/null || commit+=" with local changes"
else
  commit="not a git checkout"
fi
facts+=("source: $commit")
if [[ "$dry_run" -eq 0 ]]; then
  {
    printf '%s\n' "${facts[@]}"
    echo
    echo "== nvidia-smi"; nvidia-smi 2>&1 || true
    echo "== PyTorch"; echo "$torch_facts"; cat "$work/torch-facts.err" 2> /dev/null || true
    echo "== LibTorch include folders of note"
    for d in gloo fmt spdlog google/protobuf; do
      [[ -n "$torch_root" && -d "$torch_root/include/$d" ]] && echo "  $torch_root/include/$d exists"
    done
    echo "== /etc/os-release"; cat /etc/os-release 2> /dev/null || true
    echo "== CUDA"; cat /usr/local/cuda/version.json 2> /dev/null || true
    echo "== ldd libtorch_cuda.so"; ldd "$torch_root/lib/libtorch_cuda.so" 2> /dev/null | grep -Ei 'nccl|cudart|cublas' || true
    echo "== carried packages"; cat "$debs/MANIFEST" 2> /dev/null || true
  } > "$out/machine.txt"
fi
for f in "${facts[@]}"; do say "$f"; done

# Gloo symbols exported by libtorch_cpu and a second Gloo linked beside it
# would mean two copies of Gloo in one process.
gloo_note=""
if [[ "$gloo_mode" == debian && "$gloo_symbols" -gt 0 ]]; then
  gloo_note="; WARNING: libtorch_cpu exports $gloo_symbols Gloo symbols and Debian's Gloo is linked too (two Gloo copies: see gloo-transport)"
fi
if [[ ${#missing[@]} -gt 0 ]]; then
  record FAIL machine 0 "missing: $(IFS=';'; echo "${missing[*]}")"
  if [[ "$dry_run" -eq 0 ]]; then
    for c in "${CHECKS[@]}"; do IFS='|' read -r n _ _ <<< "$c"; is_selected "$n" && record SKIP "$n" 0 "machine check failed"; done
    exit 1
  fi
else
  record PASS machine "$(( $(date +%s) - started ))" "${gpu_line:-no GPU (--cpu-smoke)}; glibc ${glibc##* }; gloo from $gloo_mode$gloo_note"
fi

# ---------------------------------------------------------------------------
# 2. Unpack the carried packages into the prefix.
# ---------------------------------------------------------------------------
# Left out when LibTorch brings its own Gloo.
debugger_group='^(gdb|libbabeltrace1|libdebuginfod1|libipt2|libmpfr6|libsource-highlight4v5|libxxhash0|libboost-regex1\.74\.0|libicu72|libelf1|libdw1|libglib2\.0-0|libpython3\.11|libpython3\.11-minimal)$'
gloo_group='^(libgloo-dev|libgloo0|libibverbs-dev|libibverbs1|libnl-3-dev|libnl-3-200|libnl-route-3-dev|libnl-route-3-200)$'
arch_lib="usr/lib/x86_64-linux-gnu"

# The prefix's tools first; PyTorch's torchrun and CUDA's nvcc when the PATH
# lacks them (after it, so that cmake stays the one checked above).
python_bin=$(dirname "$(command -v "$python" 2> /dev/null || echo /usr/bin/python3)")
export PATH="$prefix/usr/bin:$PATH:$python_bin:/usr/local/cuda/bin"
export LD_LIBRARY_PATH="$prefix/$arch_lib:$prefix/usr/lib:$prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$prefix/$arch_lib/pkgconfig:$prefix/usr/lib/pkgconfig:$prefix/usr/share/pkgconfig"
export VARIPIPE_REDIS_SERVER="$prefix/usr/bin/redis-server"
# No InfiniBand on one machine; keeps NCCL away from the carried libibverbs.
export NCCL_IB_DISABLE=1
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" CUDAARCHS="${CUDAARCHS:-90}"

# A link name (libz.so) whose target is a system library (libz.so.1.2.13
# on Debian, libz.so.1.3 elsewhere) is pointed at the system's library of
# the same soname; one whose target the prefix holds is pointed there.
repair_links() {
  local link target base soname system fixed=0 broken=()
  while IFS= read -r link; do
    target=$(readlink "$link")
    base=$(basename "$target")
    if [[ "$target" == /* && -e "$prefix$target" ]]; then
      ln -sfn "$prefix$target" "$link"; fixed=$((fixed + 1)); continue
    fi
    [[ -e "$link" ]] && continue
    soname=$(sed -E 's/(\.so\.[0-9]+).*/\1/' <<< "$base")
    system=$(ldconfig -p 2> /dev/null | awk -v s="$soname" '$1 == s && /x86-64/ {print $NF; exit}')
    if [[ -n "$system" ]]; then
      ln -sfn "$system" "$link"; fixed=$((fixed + 1))
    else
      broken+=("$(basename "$link")")
    fi
  done < <(find "$prefix" -type l \( -name '*.so' -o -name '*.so.*' \))
  echo "link names repaired: $fixed; still dangling (unused unless linked): ${broken[*]:-none}"
}

unpack() {
  local pkg version file bytes n=0 skipped=() into
  rm -rf "$prefix" "$debugger"
  mkdir -p "$prefix" "$debugger"
  while read -r pkg version file bytes; do
    [[ "$pkg" == \#* || -z "$pkg" ]] && continue
    if [[ "$gloo_mode" == torch && "$pkg" =~ $gloo_group ]]; then skipped+=("$pkg"); continue; fi
    [[ -f "$debs/$file" ]] || { echo "missing $debs/$file ($pkg $version): run deploy/gpu/fetch-debs.sh again"; return 1; }
    [[ "$(stat -c %s "$debs/$file")" == "$bytes" ]] || { echo "$debs/$file: size differs from MANIFEST"; return 1; }
    # The debugger's libraries (an older libelf, glib, ...) stay out of the
    # prefix, whose libraries every process of the run sees.
    into=$prefix
    [[ "$pkg" =~ $debugger_group ]] && into=$debugger
    dpkg-deb -x "$debs/$file" "$into" || { echo "dpkg-deb -x $file failed"; return 1; }
    n=$((n + 1))
  done < "$debs/MANIFEST"
  echo "unpacked $n packages into $prefix and $debugger; left out (LibTorch has Gloo): ${skipped[*]:-none}"
  # gdb on PATH (the prefix's bin leads it) through a wrapper that gives it,
  # and it alone, its libraries and Python.
  if [[ -x "$debugger/usr/bin/gdb" ]]; then
    mkdir -p "$prefix/usr/bin"
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONHOME=%s/usr exec %s/usr/bin/gdb -nx "$@"\n' \
      "$debugger" "$debugger" "$debugger" > "$prefix/usr/bin/gdb"
    chmod +x "$prefix/usr/bin/gdb"
  fi
  # Debian's CMake files name /usr in a few places (Gloo's library path,
  # the "/usr move" checks, Hiredis' hints); pkg-config files name it as
  # their prefix.
  grep -rlZ '"/usr' --include='*.cmake' "$prefix" | xargs -0 -r sed -i -E "s#\"/usr([/\"])#\"$prefix/usr\\1#g"
  find "$prefix" -name '*.pc' -print0 | xargs -0 -r sed -i -E "s#^([A-Za-z_]+)=/usr(/|\$)#\\1=$prefix/usr\\2#"
  repair_links
  # The tools must run from the prefix.
  protoc --version || return 1
  redis-server --version || return 1
  echo "hiredis $(pkg-config --modversion hiredis)" || return 1
  [[ -x "$prefix/usr/bin/grpc_cpp_plugin" ]] || { echo "no grpc_cpp_plugin in the prefix"; return 1; }
}

# ---------------------------------------------------------------------------
# 3. Configure and build.
# ---------------------------------------------------------------------------
cmake_args=(
  -S "$root" -B "$build" -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  "-DCMAKE_PREFIX_PATH=$prefix/usr"
  "-DTorch_DIR=$torch_dir"
  "-DProtobuf_PROTOC_EXECUTABLE=$prefix/usr/bin/protoc"
  "-DVARIPIPE_GRPC_CPP_PLUGIN=$prefix/usr/bin/grpc_cpp_plugin"
  "-DVARIPIPE_REDIS_SERVER=$prefix/usr/bin/redis-server"
  "-DPKG_CONFIG_EXECUTABLE=$prefix/usr/bin/pkg-config"
)
if [[ "$gloo_mode" == torch ]]; then cmake_args+=(-DVARIPIPE_GLOO_FROM_TORCH=ON); else cmake_args+=(-DVARIPIPE_GLOO_FROM_TORCH=OFF); fi
if [[ "$cpu_smoke" -eq 1 ]]; then
  cmake_args+=(-DVARIPIPE_WITH_CUDA=AUTO)
else
  cmake_args+=(-DVARIPIPE_WITH_CUDA=ON -DCUDAToolkit_ROOT=/usr/local/cuda)
fi
if [[ -n "$nccl_library" ]]; then
  cmake_args+=("-DVARIPIPE_NCCL_INCLUDE_DIR=$nccl_include" "-DVARIPIPE_NCCL_LIBRARY=$nccl_library")
fi
# CMake 4 refuses configs that ask for policies older than 3.5.
if [[ "${cmake_version%%.*}" =~ ^[0-9]+$ && "${cmake_version%%.*}" -ge 4 ]]; then
  cmake_args+=(-DCMAKE_POLICY_VERSION_MINIMUM=3.5)
fi
core_targets=(varipipe-executor varipipe-profile varipipe-plan varipipe-planner varipipe-ctl varipipe-convert-jsonl gloo_transport_test)
# What the GPU checks cannot run without.
essential_binaries=(varipipe-executor varipipe-planner varipipe-ctl varipipe-convert-jsonl)

# Every dependency must come from the prefix (or LibTorch/CUDA), not from
# whatever the machine happens to have in /usr.
check_cache_paths() {
  local cache="$build/CMakeCache.txt" var value bad=()
  for var in absl_DIR gRPC_DIR GTest_DIR benchmark_DIR spdlog_DIR fmt_DIR Protobuf_INCLUDE_DIR \
             Protobuf_LIBRARY Protobuf_LIBRARY_RELEASE Protobuf_PROTOC_EXECUTABLE VARIPIPE_GRPC_CPP_PLUGIN \
             VARIPIPE_REDIS_SERVER pkgcfg_lib_HIREDIS_hiredis Gloo_DIR; do
    value=$(sed -n "s/^$var:[A-Z]*=//p" "$cache" | head -n 1)
    [[ -z "$value" || "$value" == *-NOTFOUND ]] && continue
    [[ "$value" == "$prefix"* ]] || bad+=("$var=$value")
    echo "$var=$value"
  done
  [[ ${#bad[@]} -eq 0 ]] || { echo "found outside the prefix: ${bad[*]}"; return 1; }
}

if [[ "$dry_run" -eq 1 ]]; then
  echo
  echo "Would unpack into $prefix (gloo: $gloo_mode; the gloo group is left out when torch):"
  awk '!/^#/ {printf "  %s %s (%s)\n", $1, $2, $3}' "$debs/MANIFEST" 2> /dev/null || echo "  ($debs/MANIFEST is missing)"
  echo "then rewrite \"/usr in *.cmake and prefix=/usr in *.pc to $prefix/usr, and repair link names."
  echo "Environment: PATH=$PATH"
  echo "             LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "             PKG_CONFIG_PATH=$PKG_CONFIG_PATH NCCL_IB_DISABLE=1 TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST CUDAARCHS=$CUDAARCHS"
  echo "Would configure:"; run_dry cmake "${cmake_args[@]}"
  [[ "$configure_only" -eq 1 ]] && { echo "and stop there (--configure-only)."; exit 0; }
  echo "Would build:"; run_dry cmake --build "$build" -j "$jobs" --target "${core_targets[@]}"
  echo "Checks, in order (SKIP once the ${time_budget} s budget is spent):"
  for c in "${CHECKS[@]}"; do
    IFS='|' read -r n g d <<< "$c"
    if is_selected "$n"; then printf '  %-24s %s\n' "$n" "$d"; else printf '  %-24s (not selected)\n' "$n"; fi
  done
  exit 0
fi

# Seconds to the deadline, at least 1 (timeout 0 would mean no limit).
budget_left() { local s=$((deadline - $(date +%s))); echo $((s > 1 ? s : 1)); }
step_start=0
begin() { step_start=$(date +%s); say "== $1"; }
elapsed() { echo $(( $(date +%s) - step_start )); }
first_error() {
  { grep -m 1 -E ' error: |CMake Error|undefined reference' "$1" || grep -m 1 'FAILED' "$1" || tail -n 1 "$1"; } |
    cut -c 1-300
}
skip_rest() {
  local c n
  for c in "${CHECKS[@]}"; do IFS='|' read -r n _ _ <<< "$c"; is_selected "$n" && record SKIP "$n" 0 "$1"; done
  exit 1
}

if [[ "$skip_build" -eq 0 ]]; then
  begin unpack
  if unpack > "$logs/unpack.log" 2>&1; then
    record PASS unpack "$(elapsed)" "$(grep -m 1 '^unpacked' "$logs/unpack.log")"
  else
    record FAIL unpack "$(elapsed)" "$(tail -n 1 "$logs/unpack.log") (logs/unpack.log)"
    skip_rest "unpack failed"
  fi

  begin configure
  if timeout "$(budget_left)" cmake "${cmake_args[@]}" > "$logs/configure.log" 2>&1 &&
     check_cache_paths >> "$logs/configure.log" 2>&1; then
    record PASS configure "$(elapsed)" "$(grep -m 1 -o 'Varipipe dependencies: .*' "$logs/configure.log")"
  else
    record FAIL configure "$(elapsed)" "$(grep -m 1 -E 'CMake Error|found outside' "$logs/configure.log" || tail -n 1 "$logs/configure.log") (logs/configure.log)"
    skip_rest "configure failed"
  fi
  [[ "$configure_only" -eq 0 ]] || { say "stopping after configure (--configure-only)"; exit 0; }

  begin build
  rm -f "$build/.built-all"
  # -k 0: every compile error in one run, and whatever can build does.
  if timeout "$(budget_left)" cmake --build "$build" -j "$jobs" --target "${core_targets[@]}" -- -k 0 \
       > "$logs/build.log" 2>&1; then
    record PASS build "$(elapsed)" "executor, profiler, planner tools and gloo_transport_test with $jobs jobs"
  else
    missing_binaries=()
    for b in "${essential_binaries[@]}"; do [[ -x "$build/bin/$b" ]] || missing_binaries+=("$b"); done
    if [[ ${#missing_binaries[@]} -gt 0 ]]; then
      record FAIL build "$(elapsed)" "$(first_error "$logs/build.log") (logs/build.log)"
      skip_rest "build failed"
    fi
    record FAIL build "$(elapsed)" "$(first_error "$logs/build.log") (logs/build.log); the executor and planner built, the checks run"
  fi
else
  [[ -x "$build/bin/varipipe-executor" ]] || die "--skip-build but $build/bin/varipipe-executor does not exist"
  record SKIP build 0 "--skip-build: using $build as it is"
fi
bin="$build/bin"

# Two Gloos: libtorch_cpu exports its own (newer) Gloo's symbols, and a
# process that loads it before Debian's libgloo binds Varipipe's Gloo calls
# to Torch's copy, whose classes differ from the headers it was compiled
# with (a crash at the first rendezvous). Preloading Debian's libgloo puts
# its symbols first for every process of the checks.
if [[ "$gloo_mode" == debian && "$gloo_symbols" -gt 0 ]]; then
  debian_gloo=$(find "$prefix/usr/lib" -maxdepth 2 -name 'libgloo.so.0*' -type f | head -n 1)
  if [[ -n "$debian_gloo" ]]; then
    export LD_PRELOAD="$debian_gloo${LD_PRELOAD:+:$LD_PRELOAD}"
    say "LD_PRELOAD=$LD_PRELOAD (Debian's Gloo before the one inside libtorch_cpu)"
  fi
fi

# libstdc++ before LibTorch in every binary's needed libraries: PyTorch's
# libtorch.so exports a copy of std::filesystem whose remove_all calls a null
# pointer, and a binary that loads libtorch.so first runs that copy (every
# test crashed in its RedisServer's destructor on 2026-11-27). The build
# names libstdc++ first (CMakeLists.txt); should it not have, the checks
# preload the machine's libstdc++ so that they still run, and say so.
link_order() {  # BINARY: "ok", or the first needed libraries
  local needed
  needed=$(readelf -d "$1" 2> /dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  local cxx torch
  cxx=$(grep -n '^libstdc++' <<< "$needed" | head -n 1 | cut -d: -f1)
  torch=$(grep -n '^libtorch' <<< "$needed" | head -n 1 | cut -d: -f1)
  if [[ -n "$cxx" && ( -z "$torch" || "$cxx" -lt "$torch" ) ]]; then echo ok; else
    echo "libstdc++ at ${cxx:-none}, libtorch at ${torch:-none} of: $(head -n 6 <<< "$needed" | tr '\n' ' ')"; fi
}
if command -v readelf > /dev/null; then
  order=$(link_order "$bin/varipipe-executor")
  if [[ "$order" == ok ]]; then
    say "link order: libstdc++ before LibTorch in varipipe-executor"
  else
    system_cxx=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
    say "WARNING link order: varipipe-executor loads LibTorch before libstdc++ ($order); preloading $system_cxx"
    [[ -n "$system_cxx" ]] && export LD_PRELOAD="$system_cxx${LD_PRELOAD:+:$LD_PRELOAD}"
  fi
fi

# ---------------------------------------------------------------------------
# 4. The checks.
# ---------------------------------------------------------------------------
# Helpers for the checks; each check runs in a subshell with its own log,
# writes a one-line note to $note, and exits 0 (PASS), 77 (SKIP) or other.
cat > "$work/gpu_tools.py" << 'EOF'
"""Job configs and result checks for deploy/gpu/run-on-gpu.sh."""
import glob, json, math, os, re, sys


def jsonl(path):
    rows = []
    if os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def configs(template, data, jobs, hardware):
    """Writes the job configs every check uses into JOBS."""
    base = json.load(open(template))
    def mt(job_id, dtype, iterations, pipeline=1):
        c = json.loads(json.dumps(base))
        c["job_id"] = job_id
        c["model"]["dtype"] = dtype
        c["parallelism"] = {"pipeline": pipeline, "data": 1}
        c["cluster"] = {"devices_per_node": pipeline, "device_memory_limit_mib": 24}
        c["data"]["path"] = os.path.join(data, "multitask_input")
        c["data"]["target_path"] = os.path.join(data, "multitask_target")
        c["planner"]["plan_ahead"] = 32
        c["training"]["iterations"] = iterations
        c["training"].pop("checkpoint_dir", None)
        # The quickstart's Hugging Face base lives beside its own run.
        c["training"].pop("init_from", None)
        c["training"]["watchdog_timeout_s"] = 120
        return c
    def gpt(job_id, layers, hidden, heads, methods, max_len=2048, mixture="FLAN_LIKE",
            tokens=65536, iterations=6):
        return {
            "job_id": job_id,
            "model": {"kind": "gpt", "num_layers": layers, "hidden_size": hidden,
                      "num_attention_heads": heads, "ffn_hidden_size": 4 * hidden,
                      "vocab_size": 50432, "dtype": "bfloat16", "attention_kernel": "FUSED"},
            "parallelism": {"pipeline": 1, "data": 1},
            "cluster": {"devices_per_node": 1, "device_memory_limit_mib": 65536,
                        "hardware": hardware},
            "data": {"format": "synthetic", "tokens_per_global_batch": tokens,
                     "max_sequence_length": max_len, "seed": 1234,
                     "synthetic_num_samples": 100000, "synthetic_mixture": mixture},
            # No methods: the planner's default search (every method).
            "planner": dict({"plan_ahead": 16}, **({"partition_methods": methods} if methods else {})),
            "training": {"iterations": iterations, "learning_rate": 1e-4, "warmup_iterations": 1,
                         "watchdog_timeout_s": 300},
        }
    os.makedirs(jobs, exist_ok=True)
    out = {
        "mt-fp32": mt("gpu-mt-fp32", "float32", 10),
        "mt-bf16": mt("gpu-mt-bf16", "bfloat16", 30),
        "mt-pp2": mt("gpu-mt-pp2", "float32", 2, pipeline=2),
        # Layer stacks with the shapes of GPT-1.3B and GPT-6.7B, fewer layers.
        "gpt1.3b-like": gpt("gpu-gpt1.3b-like", 8, 2048, 16, ["dynamic_programming"]),
        "gpt6.7b-like": gpt("gpu-gpt6.7b-like", 4, 4096, 32, ["dynamic_programming"]),
    }
    # One GPU, maximum length 8,192, each micro-batching method on two mixtures.
    for mixture in ["FLAN_LIKE", "DOCUMENTS"]:
        for m in SPEED_METHODS:
            name = f"speed-{mixture.lower().replace('_', '-')}-{m}"
            method = m.removesuffix("-mask")
            job = gpt("gpu-" + name.replace("_", "-"), 8, 2048, 16,
                      None if method == "default" else [method], max_len=8192,
                      mixture=mixture, iterations=10)
            if m.endswith("-mask"):
                job["model"]["packed_attention"] = "BLOCK_DIAGONAL_MASK"
            out[name] = job
    # The profiler's job: a hidden-4,096 (GPT-6.7B) layer up to 8,192 tokens,
    # without recomputation (the MFU of one stage's layer).
    h4096 = gpt("gpu-profile-h4096", 2, 4096, 32, ["dynamic_programming"], max_len=8192,
                tokens=16384)
    h4096["planner"]["recompute_modes"] = ["RECOMPUTE_NONE"]
    out["profile-h4096"] = h4096
    for name, c in out.items():
        d = os.path.join(jobs, name)
        os.makedirs(d, exist_ok=True)
        json.dump(c, open(os.path.join(d, "job.json"), "w"), indent=1)


# "default": no partition_methods, the planner's default search; the others
# narrow the search to one method (its parameter still tuned per mini-batch);
# "packing-mask" packs under the block-diagonal mask instead of the planner's
# choice (per-sample attention on these jobs, which ran 6 to 23 s an
# iteration on the H200 on 2026-11-27, warming up, while token-based ran
# 1.6 s).
SPEED_METHODS = ["default", "packing", "packing-mask", "token_based"]


def mfu(cost_model, peak_tflops, lengths):
    """MFU of the profiled layer (no recomputation) at the largest measured
    micro-batch of each length: Megatron's FLOP count over device time."""
    c = json.load(open(cost_model))
    h = c["model"]["hidden_size"]
    f = c["model"].get("ffn_hidden_size", 4 * h)
    notes = []
    for g in c["grids"]:
        if g["component"] != "ENCODER_LAYER" or g.get("recompute", "RECOMPUTE_NONE") != "RECOMPUTE_NONE":
            continue
        sizes, seqs = g["micro_batch_sizes"], g["seq_lens"]
        fwd, bwd = g["forward_ms"], g["backward_ms"]
        print("b\ts\ttokens\tforward_ms\tbackward_ms\ttflops\tmfu")
        for si, s in enumerate(seqs):
            best = None
            for bi, b in enumerate(sizes):
                k = bi * len(seqs) + si
                t = float(fwd[k]) + float(bwd[k])
                if not math.isfinite(t) or t <= 0:
                    continue
                flops = 3 * b * s * (8 * h * h + 4 * h * f + 4 * s * h)
                tf = flops / (t * 1e-3) / 1e12
                print(f"{b}\t{s}\t{b * s}\t{float(fwd[k]):.3f}\t{float(bwd[k]):.3f}\t{tf:.1f}\t"
                      f"{100 * tf / peak_tflops:.1f}%")
                best = (b, tf)
            if s in lengths and best:
                notes.append(f"s={s} b={best[0]}: {best[1]:.0f} TFLOP/s, MFU {100 * best[1] / peak_tflops:.1f}%")
    print("NOTE hidden-4096 layer, bf16, fused attention (device times): " + "; ".join(notes))
    return 0 if notes else 1


def compare(cpu_dir, gpu_dir, tolerance):
    """Per-iteration losses and gradient norms of two runs of the same plans."""
    cpu, gpu = jsonl(cpu_dir + "/metrics.jsonl"), jsonl(gpu_dir + "/metrics.jsonl")
    if not cpu or len(cpu) != len(gpu):
        print(f"iterations: cpu {len(cpu)}, gpu {len(gpu)}")
        return 1
    worst = 0.0
    for c, g in zip(cpu, gpu):
        rel = abs(c["loss"] - g["loss"]) / max(abs(c["loss"]), 1e-12)
        grad = abs(c["grad_norm"] - g["grad_norm"]) / max(abs(c["grad_norm"]), 1e-12)
        worst = max(worst, rel)
        print(f"iteration {c['iteration']}: loss cpu {c['loss']:.6f} gpu {g['loss']:.6f} "
              f"(rel {rel:.2e}); grad norm cpu {c['grad_norm']:.5f} gpu {g['grad_norm']:.5f} "
              f"(rel {grad:.2e})")
    verdict = "match" if worst <= tolerance else "DIFFER"
    print(f"NOTE {len(cpu)} iterations, losses {verdict}: largest relative difference "
          f"{worst:.2e} (tolerance {tolerance:g}); cpu {cpu[-1]['loss']:.4f}, gpu {gpu[-1]['loss']:.4f} at the end")
    return 0 if worst <= tolerance else 1


def loss_falls(run_dir, iterations):
    rows = jsonl(run_dir + "/metrics.jsonl")
    if len(rows) < iterations:
        print(f"NOTE only {len(rows)} of {iterations} iterations ran")
        return 1
    first = sum(r["loss"] for r in rows[:3]) / 3
    last = sum(r["loss"] for r in rows[-3:]) / 3
    tokens = [r["real_tokens_per_s"] for r in rows[1:]]
    print(f"NOTE loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f} (mean of first 3 "
          f"{first:.4f}, last 3 {last:.4f}); {sum(tokens) / len(tokens):.0f} real tokens/s; "
          f"peak {max(r['peak_memory_mib'] for r in rows):.0f} MiB")
    return 0 if last < 0.9 * first and all(math.isfinite(r["loss"]) for r in rows) else 1


def flops_per_token(model, seq):
    """Training FLOPs per token, Megatron's count (no recomputation)."""
    h, L = model["hidden_size"], model["num_layers"]
    f, v = model.get("ffn_hidden_size", 4 * h), model["vocab_size"]
    return 3 * (L * (8 * h * h + 4 * h * f + 4 * seq * h) + 2 * h * v)


def plans(run_dir):
    """Micro-batch shapes per iteration from `varipipe-ctl plan` output."""
    shapes = {}
    for path in glob.glob(run_dir + "/plan-*.txt"):
        it = int(re.search(r"plan-(\d+)\.txt", path).group(1))
        shapes[it] = {int(m.group(1)): (int(m.group(2)), int(m.group(3)))
                      for m in re.finditer(r"micro-batch (\d+): (\d+) samples, padded (\d+)",
                                           open(path).read())}
    return shapes


def plan_headers(run_dir):
    """Per iteration: (method, schedule, recompute, micro-batches, predicted ms)."""
    heads = {}
    for path in glob.glob(run_dir + "/plan-*.txt"):
        it = int(re.search(r"plan-(\d+)\.txt", path).group(1))
        m = re.search(r"(\d+) micro-batches, schedule (\S+), (\S+), recompute (\S+), "
                      r"predicted ([0-9.]+) ms", open(path).read())
        if m:
            heads[it] = (m.group(3), m.group(2), m.group(4), int(m.group(1)), float(m.group(5)))
    return heads


def timings(run_dir, name, peak_tflops):
    """Per-micro-batch times (from the progress reports) joined with the plans."""
    job = json.load(open(run_dir + "/job.json"))
    model = job["model"]
    shapes = plans(run_dir)
    reports = {}
    for r in jsonl(run_dir + "/reports.jsonl"):
        reports[int(r.get("iteration", 0))] = r
    rows = jsonl(run_dir + "/metrics.jsonl")
    with open(run_dir + "/timings.tsv", "w") as tsv:
        tsv.write("iteration\tmicro_batch\tsamples\tpadded_len\ttokens\tforward_ms\tbackward_ms\n")
        for it in sorted(reports):
            for t in reports[it].get("timings", []):
                mb = int(t.get("micro_batch", t.get("microBatch", 0)))
                samples, length = shapes.get(it, {}).get(mb, (0, 0))
                tsv.write(f"{it}\t{mb}\t{samples}\t{length}\t{samples * length}\t"
                          f"{t.get('forward_ms', t.get('forwardMs', 0)):.3f}\t"
                          f"{t.get('backward_ms', t.get('backwardMs', 0)):.3f}\n")
    planned = job["training"]["iterations"]
    if len(rows) < min(3, planned):
        print(f"NOTE {name}: only {len(rows)} of {planned} iterations ran")
        return 1
    # The steady state: the later half of the iterations that ran (new
    # shapes make the first ones slow on a GPU: allocator, kernel plans).
    steady = rows[len(rows) // 2:]
    first_step = rows[0]["step_ms"]
    step = sum(r["step_ms"] for r in steady) / len(steady)
    tokens = sum(r["real_tokens_per_s"] for r in steady) / len(steady)
    overhead = sum(r["interpreter_overhead_ms"] for r in steady) / len(steady)
    instructions = sum(r["instructions"] for r in steady) / len(steady)
    padded = [(s * l, l) for it in shapes for (s, l) in shapes[it].values()]
    seq = (sum(t * l for t, l in padded) / sum(t for t, _ in padded)) if padded else \
        job["data"]["max_sequence_length"] / 2
    mfu = ""
    if peak_tflops > 0:
        mfu = f"{100 * tokens * flops_per_token(model, seq) / (peak_tflops * 1e12):.1f}%"
    # What the planner chose for the measured iterations, and its prediction.
    heads = plan_headers(run_dir)
    chosen = {}
    predicted = []
    for r in steady:
        h = heads.get(int(r["iteration"]))
        if h:
            key = f"{h[0]}/{h[1]}/{h[2]}"
            chosen[key] = chosen.get(key, 0) + 1
            predicted.append(h[4])
    plans_text = ",".join(f"{k}x{n}" for k, n in sorted(chosen.items())) or "n/a"
    predicted_ms = f"{sum(predicted) / len(predicted):.1f}" if predicted else ""
    with open(run_dir + "/speed.tsv", "w") as s:
        s.write("run\ttokens_per_s\tstep_ms\tcompute_ms\tinterpreter_ms\tinstructions\t"
                "padding_efficiency\tmean_padded_len\tmfu\tpredicted_ms\tplans\t"
                "iterations\tfirst_step_ms\n")
        s.write(f"{name}\t{tokens:.0f}\t{step:.1f}\t"
                f"{sum(r['compute_ms'] for r in steady) / len(steady):.1f}\t{overhead:.3f}\t"
                f"{instructions:.0f}\t"
                f"{sum(r['padding_efficiency'] for r in steady) / len(steady):.3f}\t{seq:.0f}\t{mfu}\t"
                f"{predicted_ms}\t{plans_text}\t{len(steady)}/{len(rows)}/{planned}\t"
                f"{first_step:.1f}\n")
    print(f"NOTE {name}: {tokens:.0f} tokens/s, step {step:.0f} ms, MFU {mfu or 'n/a'}, "
          f"interpreter {overhead:.2f} ms for {instructions:.0f} instructions, "
          f"{sum(len(r.get('timings', [])) for r in reports.values())} micro-batch timings")
    return 0


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "configs":
        configs(*args)
    elif cmd == "compare":
        sys.exit(compare(args[0], args[1], float(args[2])))
    elif cmd == "loss-falls":
        sys.exit(loss_falls(args[0], int(args[1])))
    elif cmd == "timings":
        sys.exit(timings(args[0], args[1], float(args[2])))
    elif cmd == "mfu":
        sys.exit(mfu(args[0], float(args[1]), [512, 2048, 8192]))
    else:
        sys.exit(f"unknown command {cmd}")
EOF

hardware=h100-80gb
device_name=$(tf device_name)
gpu_slug=$(echo "$device_name" | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z0-9' '-' | sed 's/-$//')
[[ "$device_name" == *H200* ]] && hardware=h200
if [[ -z "$peak_tflops" ]]; then
  # Dense bf16 peaks from NVIDIA's datasheets (SXM parts); 0: MFU not computed.
  case "$device_name" in
    *H100*PCIe*) peak_tflops=756 ;;
    *H100*|*H200*) peak_tflops=989 ;;
    *) peak_tflops=0 ;;
  esac
fi
"$python" "$work/gpu_tools.py" configs "$root/deploy/configs/quickstart-train.json" \
  "$work/data" "$work/jobs" "$hardware"

# The quickstart's multi-task dataset, made once.
ensure_dataset() {
  [[ -s "$work/data/multitask_input.idx" ]] && return 0
  mkdir -p "$work/data"
  "$root/deploy/make-multitask-dataset.sh" "$work/data/multitask.jsonl" --samples 4000 --vocab 128 --seed 7
  "$bin/varipipe-convert-jsonl" --input "$work/data/multitask.jsonl" \
    --output_prefix "$work/data/multitask" --vocab_size 128 > /dev/null
}

# train RUN_DIR JOB DEVICE LAUNCHER [SECONDS]: a planner daemon (embedded
# Redis) and one executor rank on DEVICE (cpu: the GPU hidden) started by
# LAUNCHER (direct or torchrun); metrics.jsonl, the rank's progress reports
# (reports.jsonl), the plans (plan-N.txt) and the logs land in RUN_DIR.
train() {
  local dir=$1 job=$2 device=$3 launcher=$4 limit=${5:-300} planner_pid="" exec_pid="" addr pw i n
  rm -rf "$dir"
  mkdir -p "$dir"
  cp "$work/jobs/$job/job.json" "$dir/job.json"
  local job_id iterations
  job_id=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["job_id"])' "$dir/job.json")
  iterations=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["training"]["iterations"])' "$dir/job.json")
  # --keep_serving: varipipe-ctl status reads the daemon after the executor.
  "$bin/varipipe-planner" --config "$dir/job.json" --listen 127.0.0.1:0 --port_file "$dir/planner.port" \
    --store_file "$dir/store" --progress_interval_s 0 --keep_serving 2> "$dir/planner.log" &
  planner_pid=$!
  # shellcheck disable=SC2064  # the pid is known now
  trap "kill $planner_pid 2> /dev/null || true" EXIT
  for _ in $(seq 1 300); do
    [[ -s "$dir/planner.port" && -s "$dir/store" ]] && break
    kill -0 "$planner_pid" 2> /dev/null || { cat "$dir/planner.log"; return 1; }
    sleep 0.1
  done
  local planner
  planner="127.0.0.1:$(cat "$dir/planner.port")"
  read -r addr pw < "$dir/store"
  # The plans, before the executor acknowledges (and so deletes) them;
  # at most a minute for all (the daemon plans ahead of any executor).
  local dump_end=$(( $(date +%s) + 60 ))
  # DUMP_PLANS=0: no dumps (a job that plans only just ahead of its executor).
  [[ "${DUMP_PLANS:-1}" == 1 ]] || iterations=0
  for i in $(seq 0 $((iterations - 1))); do
    until "$bin/varipipe-ctl" --planner "$planner" --store_file "$dir/store" plan \
            --iteration "$i" --rank 0 \
            > "$dir/plan-$i.txt" 2> /dev/null; do
      [[ $(date +%s) -lt $dump_end ]] || break 2
      sleep 0.1
    done
  done
  local -a device_env=()
  [[ "$device" == cpu ]] && device_env=(CUDA_VISIBLE_DEVICES=)
  local -a exec_args=(--planner "$planner" --store_file "$dir/store" --metrics_jsonl "$dir/metrics.jsonl"
                      --status_port -1 --run_id "$job_id")
  # EXEC_EXTRA: more executor flags, separated by spaces.
  local -a extra=()
  read -r -a extra <<< "${EXEC_EXTRA:-}"
  exec_args+=("${extra[@]}")
  if [[ "$launcher" == torchrun ]]; then
    (cd "$dir" && env "${device_env[@]}" timeout "$limit" torchrun --standalone --nnodes 1 \
       --nproc_per_node 1 --no_python --redirects 2 --tee 2 --log_dir "$dir/torchrun" \
       "$bin/varipipe-executor" "${exec_args[@]}") > "$dir/executor.log" 2>&1 &
  else
    (cd "$dir" && env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 "${device_env[@]}" timeout "$limit" \
       "$bin/varipipe-executor" "${exec_args[@]}") \
      > "$dir/executor.log" 2>&1 &
  fi
  exec_pid=$!
  # Progress reports: the last one per rank lives in Redis; poll it while
  # the executor runs, and once after.
  poll() {
    redis-cli -h "${addr%:*}" -p "${addr##*:}" --no-auth-warning -a "$pw" \
      HGET "varipipe:$job_id:reports" 0 >> "$dir/reports.raw" 2> /dev/null || true
    n=$((n + 1))
  }
  n=0
  while kill -0 "$exec_pid" 2> /dev/null; do poll; sleep 0.2; done
  local rc=0
  wait "$exec_pid" || rc=$?
  poll
  grep '^{' "$dir/reports.raw" 2> /dev/null | awk '!seen[$0]++' > "$dir/reports.jsonl" || true
  # The daemon's own account (prediction error against the measured times).
  timeout 20 "$bin/varipipe-ctl" --planner "$planner" --store_file "$dir/store" status \
    > "$dir/status.txt" 2>&1 || true
  kill "$planner_pid" 2> /dev/null || true
  wait "$planner_pid" 2> /dev/null || true
  trap - EXIT
  echo "executor exit status $rc; $(wc -l < "$dir/reports.jsonl") reports from $n polls"
  tail -n 5 "$dir/executor.log"
  return "$rc"
}

note_file=""
check_end=0
left() { local s=$((check_end - $(date +%s))); echo $((s > 1 ? s : 1)); }
note() { echo "$*" > "$note_file"; }

# What a crashing test binary loads and binds (LOG_DIR): its libraries,
# the providers of its Gloo symbols (LD_DEBUG=bindings), the crash trace
# with and without the preloaded Gloo, and gdb's backtrace where gdb exists.
gloo_crash_facts() {  # BINARY GTEST_FILTER LOG_DIR
  local bin_path=$1 filter=$2 dir=$3
  mkdir -p "$dir"
  ldd "$bin_path" > "$dir/ldd.txt" 2>&1 || true
  timeout 60 "$bin_path" "$filter" > "$dir/run-preload.txt" 2>&1 || true
  LD_PRELOAD='' timeout 60 "$bin_path" "$filter" > "$dir/run-no-preload.txt" 2>&1 || true
  # The crash trace's "object(+0x..)" and "(object+0x..)" frames, named by addr2line.
  if command -v addr2line > /dev/null; then
    grep -ohE '[^ ()]+\(\+0x[0-9a-f]+\)|\([^ ()]+\+0x[0-9a-f]+' "$dir/run-preload.txt" |
      sed -E 's/^\(//; s/\(\+/ /; s/\)$//; s/\+0x/ 0x/' | while read -r object offset; do
        echo "$object $offset $(addr2line -f -C -e "$object" "$offset" 2> /dev/null | head -n 1)"
      done > "$dir/frames.txt" 2>&1 || true
  fi
  LD_DEBUG=bindings LD_DEBUG_OUTPUT="$dir/bindings" timeout 60 "$bin_path" "$filter" \
    > /dev/null 2>&1 || true
  # Which library each Gloo symbol bound to, once per symbol and provider.
  cat "$dir"/bindings.* 2> /dev/null | grep -E "binding file .* to .*: normal symbol .*gloo" |
    sed -E 's/^ *[0-9]+: *//' | sort -u > "$dir/gloo-bindings.all" || true
  { echo "Gloo symbols bound, by providing library:"
    grep -oE ' to [^ ]+ ' "$dir/gloo-bindings.all" | sort | uniq -c | sort -rn
    echo; head -n 200 "$dir/gloo-bindings.all"; } > "$dir/gloo-bindings.txt" 2>&1 || true
  rm -f "$dir/gloo-bindings.all"
  rm -f "$dir"/bindings.*
  # Gloo symbols each copy defines, and those the binary itself asks for: a
  # symbol both define binds to the first in load order, one only PyTorch's
  # Gloo defines always binds there.
  local lib
  for lib in $(ldd "$bin_path" | awk '/libgloo|libtorch_cpu|libtorch_cuda/ {print $3}'); do
    nm -D --defined-only "$lib" 2> /dev/null | awk '$3 ~ /^_ZN4gloo|^_ZTVN4gloo|^_ZTIN4gloo/ {print $3}' |
      sort -u > "$dir/defined-by-$(basename "$lib").txt"
  done
  nm -D --undefined-only "$bin_path" 2> /dev/null | awk '{print $2}' | grep gloo | sort -u |
    c++filt > "$dir/undefined-in-binary.txt" || true
  if command -v gdb > /dev/null; then
    timeout 90 gdb -batch -ex 'handle SIGPIPE nostop noprint' -ex run -ex 'info registers rip rsp' \
      -ex 'x/4gx $sp' -ex 'info symbol *(void**)$sp' -ex 'x/8i *(void**)$sp - 24' \
      -ex 'bt 40' -ex 'thread apply all bt 25' -ex 'info sharedlibrary' \
      --args "$bin_path" "$filter" > "$dir/gdb.txt" 2>&1 || true
  else
    echo "no gdb on this machine" > "$dir/gdb.txt"
  fi
}

check_gloo_transport() {
  CUDA_VISIBLE_DEVICES='' timeout "$(left)" ctest --test-dir "$build" -R '^gloo_transport_test\.' \
    --output-on-failure --no-tests=error > "$1/ctest.log" 2>&1 || {
    cat "$1/ctest.log"
    CUDA_VISIBLE_DEVICES='' gloo_crash_facts "$build/tests/gloo_transport_test" '--gtest_filter=*TransfersPairInChannelOrder*' \
      "$logs/gloo-crash" || true
    note "$(grep -m 1 -E 'tests passed|No tests were found|SEGFAULT|Exception' "$1/ctest.log" || tail -n 1 "$1/ctest.log")"
    return 1
  }
  cat "$1/ctest.log"
  note "$(grep -m 1 'tests passed' "$1/ctest.log")"
}

check_gpu_fp32_vs_cpu() {
  ensure_dataset
  local half=$(( $(left) / 2 ))
  train "$1/cpu" mt-fp32 cpu direct "$half" || { note "the CPU run failed (exit $?; 124: out of time)"; return 1; }
  NVIDIA_TF32_OVERRIDE=0 train "$1/gpu" mt-fp32 cuda direct "$(left)" ||
    { note "the GPU run failed (exit $?): $(grep -m 1 -iE 'error|fail' "$1/gpu/executor.log" | cut -c 1-200)"; return 1; }
  grep -q 'device cuda:0' "$1/gpu/executor.log" || { note "the GPU run did not report device cuda:0"; return 1; }
  grep -q 'device cpu' "$1/cpu/executor.log" || { note "the CPU run did not report device cpu"; return 1; }
  local rc=0
  "$python" "$work/gpu_tools.py" compare "$1/cpu" "$1/gpu" 1e-3 > "$1/compare.txt" || rc=$?
  cat "$1/compare.txt"
  note "$(sed -n 's/^NOTE //p' "$1/compare.txt")"
  return "$rc"
}

check_gpu_bf16_train() {
  ensure_dataset
  command -v torchrun > /dev/null || { note "torchrun not found next to $python"; return 1; }
  train "$1/run" mt-bf16 cuda torchrun "$(left)" ||
    { note "the run failed (exit $?): $(grep -m 1 -iE 'error|fail' "$1/run/executor.log" | cut -c 1-200)"; return 1; }
  grep -q 'mixed precision: CUDA autocast to BFLOAT16' "$1/run/executor.log" ||
    { note "no 'mixed precision: CUDA autocast to BFLOAT16' in the executor's log"; return 1; }
  local rc=0
  "$python" "$work/gpu_tools.py" loss-falls "$1/run" 30 > "$1/loss.txt" || rc=$?
  cat "$1/loss.txt"
  note "bf16 autocast: $(sed -n 's/^NOTE //p' "$1/loss.txt")"
  return "$rc"
}

# One steady-state iteration under LibTorch's CUDA synchronisation debug mode
# (--cuda_sync_debug_iteration): its synchronising calls against the
# executor's own count of host reads (target: at most 2 at data parallelism
# 1), and the profiler's trace of the next iteration summarised by kernel kind
# (--profile_iteration; the trace file stays in the check's folder).
check_host_syncs() {
  ensure_dataset
  EXEC_EXTRA="--iterations 6 --cuda_sync_debug_iteration 4 --profile_iteration 5 --profile_dir $1/run/trace" \
    DUMP_PLANS=0 train "$1/run" mt-bf16 cuda direct "$(left)" ||
    { note "the run failed (exit $?): $(grep -m 1 -iE 'error|fail' "$1/run/executor.log" | cut -c 1-200)"; return 1; }
  local syncs reads trace
  syncs=$(grep -c 'synchronizing CUDA operation' "$1/run/executor.log" || true)
  reads=$(grep -oE 'iteration 4: .*host reads [0-9]+' "$1/run/executor.log" | grep -oE '[0-9]+$' || true)
  trace=$(grep -m 1 -oE '(device|host) trace: .*' "$1/run/executor.log" | cut -c 1-300 || true)
  note "iteration 4: ${syncs:-?} synchronising CUDA calls (LibTorch's debug mode), host reads ${reads:-?} (target: at most 2); ${trace:-no trace summary}"
  [[ -n "$syncs" && "$syncs" -le 2 ]]
}

# two_ranks_on_cuda0 DIR [EXECUTOR FLAGS]: the pp=2 job with both ranks on
# cuda:0 (LOCAL_RANK=0 for each); the executors' logs in DIR/run; returns
# the first failing rank's status (124: a hang).
two_ranks_on_cuda0() {
  ensure_dataset
  local dir=$1/run planner_pid pids=() r rc=0 limit
  shift
  limit=$(( $(left) < 150 ? $(left) : 150 ))
  mkdir -p "$dir"
  cp "$work/jobs/mt-pp2/job.json" "$dir/job.json"
  "$bin/varipipe-planner" --config "$dir/job.json" --listen 127.0.0.1:0 --port_file "$dir/planner.port" \
    --store_file "$dir/store" --progress_interval_s 0 2> "$dir/planner.log" &
  planner_pid=$!
  # shellcheck disable=SC2064  # the pid is known now
  trap "kill $planner_pid 2> /dev/null || true" EXIT
  for _ in $(seq 1 300); do [[ -s "$dir/planner.port" && -s "$dir/store" ]] && break; sleep 0.1; done
  # Both ranks on cuda:0: LOCAL_RANK 0 for each.
  for r in 0 1; do
    (cd "$dir" && RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 timeout "$limit" "$bin/varipipe-executor" \
       --planner "127.0.0.1:$(cat "$dir/planner.port")" --store_file "$dir/store" --status_port -1 \
       --run_id two-ranks "$@" > "$dir/rank$r.log" 2>&1) &
    pids+=($!)
  done
  for r in 0 1; do wait "${pids[$r]}" || rc=$?; done
  kill "$planner_pid" 2> /dev/null || true
  tail -n 20 "$dir/rank0.log" "$dir/rank1.log"
  return "$rc"
}

check_two_ranks_one_gpu_nccl() {
  local dir=$1/run rc=0 limit
  limit=$(( $(left) < 150 ? $(left) : 150 ))
  two_ranks_on_cuda0 "$1" || rc=$?
  if [[ $rc -eq 124 ]]; then note "hung for $limit s (no clear error)"; return 1; fi
  if [[ $rc -eq 0 ]]; then note "both ranks trained on one GPU over NCCL (NCCL accepted two ranks on one device)"; return 0; fi
  local line
  line=$(grep -h -m 1 -i 'nccl' "$dir/rank0.log" "$dir/rank1.log" | head -n 1 | cut -c 1-220 || true)
  if [[ -n "$line" ]]; then note "refused clearly, as expected: $line"; return 0; fi
  note "failed without naming NCCL: $(grep -h -m 1 -iE 'error' "$dir/rank0.log" | cut -c 1-200)"
  return 1
}

# Both ranks on cuda:0 over Gloo, device buffers staged through the host
# (--transport gloo): every iteration must train on both.
check_two_ranks_one_gpu_gloo() {
  local dir=$1/run rc=0
  two_ranks_on_cuda0 "$1" --transport gloo || rc=$?
  if [[ $rc -ne 0 ]]; then
    note "rank failed ($rc): $(grep -h -m 1 -iE 'error|fail' "$dir/rank0.log" "$dir/rank1.log" | head -n 1 | cut -c 1-200)"
    return 1
  fi
  note "both ranks trained on cuda:0 over $(grep -h -m 1 -o 'transport: .*' "$dir/rank0.log" | cut -c 12-80); $(grep -h -c -iE 'iteration [0-9]+.*loss' "$dir/rank0.log") iteration lines on rank 0; last: $(grep -h -iE 'iteration [0-9]+.*loss' "$dir/rank0.log" | tail -n 1 | cut -c 1-160)"
  return 0
}

check_pending() {  # DIR REASON
  note "$2"
  return 77
}

check_layer_timings() {
  local model rc=0 notes=()
  for model in gpt1.3b-like gpt6.7b-like; do
    # Synchronous launches: the executor's host-side timings then cover the
    # device work of each forward and backward.
    if CUDA_LAUNCH_BLOCKING=1 train "$1/$model" "$model" cuda direct "$(( $(left) * 2 / 3 ))"; then
      "$python" "$work/gpu_tools.py" timings "$1/$model" "$model" "$peak_tflops" > "$1/$model/result.txt" || rc=1
      cp "$1/$model/timings.tsv" "$logs/timings-$model.tsv" 2> /dev/null || true
      notes+=("$(sed -n 's/^NOTE //p' "$1/$model/result.txt")")
    else
      notes+=("$model failed: $(grep -m 1 -iE 'error|out of memory' "$1/$model/executor.log" | cut -c 1-160)")
      rc=1
    fi
  done
  note "$(IFS=';'; echo "${notes[*]}") (with CUDA_LAUNCH_BLOCKING=1)"
  return "$rc"
}

check_speed() {
  local mixture method run rc=0 failed=() runs=() i=0
  local methods=(default packing packing-mask token_based)
  for mixture in flan-like documents; do
    for method in "${methods[@]}"; do runs+=("speed-$mixture-$method"); done
  done
  printf 'run\ttokens_per_s\tstep_ms\tcompute_ms\tinterpreter_ms\tinstructions\tpadding_efficiency\tmean_padded_len\tmfu\tpredicted_ms\tplans\titerations\tfirst_step_ms\n' > "$logs/speed.tsv"
  for run in "${runs[@]}"; do
    i=$((i + 1))
    if [[ $(left) -lt 20 ]]; then failed+=("$run (no time left)"); rc=1; continue; fi
    # An equal share of the time left for each run still to come.
    if train "$1/$run" "$run" cuda direct "$(( $(left) / (${#runs[@]} - i + 1) ))" &&
       "$python" "$work/gpu_tools.py" timings "$1/$run" "$run" "$peak_tflops" > "$1/$run/result.txt"; then
      tail -n 1 "$1/$run/speed.tsv" >> "$logs/speed.tsv"
    else
      failed+=("$run"); rc=1
    fi
  done
  cat "$logs/speed.tsv"
  note "$(awk -F'\t' 'NR > 1 {sub(/^speed-/, "", $1); printf "%s%s %s tok/s MFU %s", sep, $1, $2, ($9 == "" ? "n/a" : $9); sep = "; "}' "$logs/speed.tsv")${failed[*]:+; failed: ${failed[*]}}; table in logs/speed.tsv"
  return "$rc"
}

# The profiler on a hidden-4,096 layer up to 8,192 tokens (quick grid, no
# recomputation): the cost model and, from its device times, the layer's MFU.
check_profile() {
  [[ -x "$bin/varipipe-profile" ]] || { note "varipipe-profile did not build"; return 1; }
  local rc=0 out="$logs/cost-model-h4096.json"
  # --threads: the layers' parameters are initialized on the host.
  timeout "$(( $(left) > 10 ? $(left) - 5 : 5 ))" "$bin/varipipe-profile" --config "$work/jobs/profile-h4096/job.json" \
    --out "$out" --quick --repeats 3 --threads "$jobs" || rc=$?
  [[ -f "$out" ]] || cp "$out.partial" "$logs/" 2> /dev/null || true
  if [[ $rc -ne 0 ]]; then note "varipipe-profile exit $rc (partial grid in logs/, if any)"; return 1; fi
  "$python" "$work/gpu_tools.py" mfu "$out" "$peak_tflops" > "$logs/mfu-h4096.tsv" || rc=$?
  cat "$logs/mfu-h4096.tsv"
  "$bin/varipipe-plan" --config "$work/jobs/profile-h4096/job.json" --cost-model "$out" --iterations 2 \
    > "$logs/plan-with-cost-model.txt" 2>&1 || { rc=1; echo "varipipe-plan refused the cost model"; }
  cat "$logs/plan-with-cost-model.txt"
  note "$(sed -n 's/^NOTE //p' "$logs/mfu-h4096.tsv"); varipipe-plan --cost-model: exit $rc"
  return "$rc"
}

# Predicted against measured iteration time of the profiled job's model:
# the analytic model, the cost model this run profiled (or the one committed
# for this GPU), and that model with online calibration. The planner plans
# one iteration ahead, so calibration reaches the plans.
check_predict() {
  local model="$logs/cost-model-h4096.json" run rc=0 notes=() err
  [[ -f "$model" ]] || model="$root/deploy/cost-models/$gpu_slug-gpt-h4096-bf16.json"
  [[ -f "$model" ]] || { note "no cost model (run profile first, or commit one as $model)"; return 1; }
  for run in analytic profiled calibrated; do
    mkdir -p "$work/jobs/predict-$run"
    "$python" - "$work/jobs/profile-h4096/job.json" "$work/jobs/predict-$run/job.json" "$run" "$model" << 'PY'
import json, sys
src, dst, run, model = sys.argv[1:]
c = json.load(open(src))
c["job_id"] = "gpu-predict-" + run
c["training"]["iterations"] = 16
c["planner"]["plan_ahead"] = 1
if run != "analytic":
    c["planner"]["cost_model_path"] = model
c["planner"]["online_calibration"] = run == "calibrated"
json.dump(c, open(dst, "w"), indent=1)
PY
    if DUMP_PLANS=0 train "$1/$run" "predict-$run" cuda direct "$(( $(left) / 2 ))"; then
      err=$(grep -m 1 'prediction error' "$1/$run/status.txt" | sed 's/^ *//')
      notes+=("$run: ${err:-no prediction error reported}")
      cat "$1/$run/status.txt"
    else
      notes+=("$run failed: $(grep -m 1 -iE 'error|out of memory' "$1/$run/executor.log" | cut -c 1-160)")
      rc=1
    fi
  done
  note "$(IFS=';'; echo "${notes[*]}") (cost model $(basename "$model"))"
  return "$rc"
}

# The equivalence cells on the GPU (equivalence_test's Cuda/*: one rank per
# model and recompute mode, packed rows too; fp32 against the reference),
# and the variable-length attention cells (the flash kernel against the
# reference kernel in bf16; the flash operators' schemas of the linked
# LibTorch against the arguments the executor passes), GPU visible, TF32 off.
check_gpu_tests() {
  local rc=0
  say "building equivalence_test, variable_length_attention_test, dispatcher_call_test"
  timeout "$(left)" cmake --build "$build" -j "$jobs" --target equivalence_test \
    variable_length_attention_test dispatcher_call_test > "$logs/build-equivalence.log" 2>&1 ||
    { note "building equivalence_test failed: $(first_error "$logs/build-equivalence.log")"; return 1; }
  NVIDIA_TF32_OVERRIDE=0 timeout "$(left)" ctest --test-dir "$build" \
    -R '^(equivalence_test\.Cuda/|variable_length_attention_test\.|dispatcher_call_test\.)' -j 4 \
    --output-on-failure --no-tests=error > "$1/ctest.log" 2>&1 || rc=$?
  cat "$1/ctest.log"
  [[ $rc -eq 0 ]] || gloo_crash_facts "$build/tests/equivalence_test" \
    '--gtest_filter=Cuda/CudaEquivalence.*/CudaGpt_OneFOneB_RecomputeNone_pp1dp1' "$logs/cuda-equivalence-crash" || true
  grep -h 'worst relative difference' "$build"/Testing/Temporary/LastTest.log > "$logs/cuda-equivalence.txt" 2> /dev/null || true
  note "$(grep -m 1 'tests passed' "$1/ctest.log"); worst over the cells: $(awk '{for (i = 1; i <= NF; ++i) if ($i == "gradients") print $(i + 1)}' "$logs/cuda-equivalence.txt" | sort -g | tail -n 1) (logs/cuda-equivalence.txt)"
  return "$rc"
}

# Golden files from transformers (deploy/gpu/hf_goldens.py), on the CPU of
# the GPU machine: this machine has transformers, the CPU machine has not.
check_hf_goldens() {
  local rc=0
  CUDA_VISIBLE_DEVICES='' timeout "$(left)" "$python" "$root/deploy/gpu/hf_goldens.py" \
    --out "$logs/hf-goldens" > "$1/goldens.txt" 2>&1 || rc=$?
  cat "$1/goldens.txt"
  note "$(sed -n 's/^NOTE //p' "$1/goldens.txt" | tr '\n' ';' | cut -c 1-400) (logs/hf-goldens/)"
  [[ $rc -eq 0 ]] || note "hf_goldens.py exit $rc: $(tail -n 1 "$1/goldens.txt" | cut -c 1-300)"
  return "$rc"
}

# A Varipipe export loaded by transformers (deploy/gpu/hf_goldens.py --check-export).
check_hf_export_loads() {
  local rc=0
  CUDA_VISIBLE_DEVICES='' timeout "$(left)" "$python" "$root/deploy/gpu/hf_goldens.py" \
    --check-export "$root/tests/data/hf/varipipe-export" --golden "$root/tests/data/hf/llama-tiny" \
    > "$1/check.txt" 2>&1 || rc=$?
  CUDA_VISIBLE_DEVICES='' timeout "$(left)" "$python" "$root/deploy/gpu/hf_goldens.py" \
    --check-export "$root/tests/data/hf/varipipe-t5-export" \
    --golden "$root/tests/data/hf/flan-t5-tiny" >> "$1/check.txt" 2>&1 || rc=$?
  cat "$1/check.txt"
  note "$(sed -n 's/^NOTE //p' "$1/check.txt" | tr '\n' ';' | cut -c 1-400)"
  [[ $rc -eq 0 ]] || note "exit $rc: $(sed -n 's/^NOTE //p' "$1/check.txt" | tr '\n' ';' | cut -c 1-300) $(tail -n 1 "$1/check.txt" | cut -c 1-200)"
  return "$rc"
}

ensure_build_all() {
  [[ -f "$build/.built-all" ]] && return 0
  say "building every target (tests)"
  timeout "$(left)" cmake --build "$build" -j "$jobs" > "$logs/build-all.log" 2>&1 ||
    { note "building the tests failed: $(first_error "$logs/build-all.log"), see logs/build-all.log"; return 1; }
  touch "$build/.built-all"
}

# Hidden GPU: the CPU path of a CUDA build, with the launcher tests that
# need Open MPI and the tests that build or run elsewhere left out.
ctest_cpu() {  # LOG ARGS...
  local log=$1 rc=0
  shift
  ensure_build_all || return 1
  CUDA_VISIBLE_DEVICES='' timeout "$(left)" ctest --test-dir "$build" --output-on-failure --no-tests=error \
    -j "$(( jobs / 2 > 1 ? jobs / 2 : 1 ))" "$@" > "$log" 2>&1 || rc=$?
  cat "$log"
  note "$(grep -m 1 'tests passed' "$log" || echo "ctest exit $rc") $(grep -A 20 'The following tests FAILED' "$log" | grep -oE '[A-Za-z_]+_test\.[A-Za-z0-9_./]+' | head -n 5 | tr '\n' ' ')"
  return "$rc"
}
check_equivalence_cpu() {
  ctest_cpu "$1/ctest.log" -R '^(equivalence_test|plan_interpreter_test|executor_training_test)\.'
}
check_ctest_cpu() {
  ctest_cpu "$1/ctest.log" -E '^(equivalence_test\.|plan_interpreter_test\.|executor_training_test\.|gloo_transport_test\.|quickstart\.quick$|build\.configure_options$|launcher_test\.VaripipeExecutor\.StartedByMpirun$)'
}

# run_check NAME MAX_SECONDS FUNCTION [ARGS...]
run_check() {
  local name=$1 max=$2 fn=$3
  shift 3
  is_selected "$name" || return 0
  local now remaining
  now=$(date +%s)
  remaining=$((deadline - now))
  if [[ $remaining -lt 30 ]]; then
    record SKIP "$name" 0 "out of time (--time-budget $time_budget); run it again with --checks $name"
    return 0
  fi
  check_end=$(( now + (max < remaining ? max : remaining) ))
  note_file="$work/$name.note"
  : > "$note_file"
  rm -rf "${work:?}/$name"
  mkdir -p "$work/$name"
  begin "$name"
  local rc=0 pid watchdog text
  # Its own process group (set -m), so that the watchdog can stop all of
  # it; not the main script's traps (its EXIT trap packs the results).
  set -m
  ( trap - EXIT INT TERM; set -euo pipefail; "$fn" "$work/$name" "$@" ) > "$logs/$name.log" 2>&1 &
  pid=$!
  set +m
  ( sleep $((check_end - now + 20)); kill -TERM -- "-$pid"; sleep 10; kill -KILL -- "-$pid" ) \
    > /dev/null 2>&1 &
  watchdog=$!
  wait "$pid" || rc=$?
  kill "$watchdog" 2> /dev/null || true
  text=$(head -c 600 "$note_file")
  case "$rc" in
    0) record PASS "$name" "$(elapsed)" "$text" ;;
    77) record SKIP "$name" "$(elapsed)" "$text" ;;
    143|137) record FAIL "$name" "$(elapsed)" "stopped after its limit of $((check_end - now)) s; ${text:-no note} (logs/$name.log)" ;;
    *) record FAIL "$name" "$(elapsed)" "${text:-exit $rc} (logs/$name.log)" ;;
  esac
}

# Most telling first: a call may end before the last check.
run_check gpu-fp32-vs-cpu 100 check_gpu_fp32_vs_cpu
run_check gpu-bf16-train 80 check_gpu_bf16_train
run_check host-syncs 90 check_host_syncs
run_check gloo-transport 120 check_gloo_transport
run_check gpu-tests 200 check_gpu_tests
run_check two-ranks-one-gpu-gloo 60 check_two_ranks_one_gpu_gloo
run_check hf-goldens 90 check_hf_goldens
run_check hf-export-loads 60 check_hf_export_loads
run_check speed 300 check_speed
run_check profile 240 check_profile
run_check predict 120 check_predict
run_check two-ranks-one-gpu-nccl 40 check_two_ranks_one_gpu_nccl
run_check nccl-allreduce-one-rank 10 check_pending \
  "pending: the NCCL transport creates no communicator for a group of one, so ncclAllReduce is not reached; NCCL send/recv between two ranks needs two GPUs"
run_check layer-timings 300 check_layer_timings
run_check equivalence-cpu 420 check_equivalence_cpu
run_check ctest-cpu 600 check_ctest_cpu

say "done: $(tail -n 1 "$summary")"
grep -q '^FAIL' "$summary" && exit 1
exit 0

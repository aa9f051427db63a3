#!/usr/bin/env bash
# Launches the K executors of a job with Open MPI, on this host or on the hosts
# of a hostfile.
#
# Usage: deploy/launch-mpirun.sh --np K [--hostfile FILE] [options] -- EXECUTOR FLAGS...
#
#   --np K                 number of executor processes (the job's pipeline x data)
#   --hostfile FILE        Open MPI hostfile ("node1 slots=8" per line); default: this host
#   --executor PATH        executor binary (default: $VARIPIPE_EXECUTOR, else
#                          build/bin/varipipe-executor of this checkout); with a
#                          hostfile it must exist at this path on every host
#   --env NAME             also export NAME to every rank (repeatable); set variables
#                          named VARIPIPE_*, NCCL_*, GLOO_*, CUDA_VISIBLE_DEVICES,
#                          LD_LIBRARY_PATH, PATH, OMP_NUM_THREADS and TORCH_* are
#                          exported anyway
#   --oversubscribe        allow more ranks than cores (CPU tests)
#   --allow-run-as-root    needed to launch as root (Open MPI refuses otherwise)
#   --mpi-arg ARG          pass ARG to mpirun (repeatable)
#   --dry-run              print the mpirun command instead of running it
#
# Ranks are placed by slot (consecutive ranks on the same host) and not bound to
# cores; the executor reads OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK and uses Open
# MPI's job id (unique per mpirun) as its run id. Example:
#   deploy/launch-mpirun.sh --np 8 --hostfile hosts -- --planner 10.0.0.5:50051
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
me=deploy/launch-mpirun.sh

die() { echo "$me: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

np=""
hostfile=""
executor="${VARIPIPE_EXECUTOR:-$root/build/bin/varipipe-executor}"
allow_root=0
oversubscribe=0
dry_run=0
extra_env=()
mpi_args=()
need_value() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (try --help)"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --np|-np|-n) need_value "$@"; np="$2"; shift 2 ;;
    --np=*) np="${1#*=}"; shift ;;
    --hostfile) need_value "$@"; hostfile="$2"; shift 2 ;;
    --hostfile=*) hostfile="${1#*=}"; shift ;;
    --executor) need_value "$@"; executor="$2"; shift 2 ;;
    --executor=*) executor="${1#*=}"; shift ;;
    --env) need_value "$@"; extra_env+=("$2"); shift 2 ;;
    --env=*) extra_env+=("${1#*=}"); shift ;;
    --mpi-arg) need_value "$@"; mpi_args+=("$2"); shift 2 ;;
    --mpi-arg=*) mpi_args+=("${1#*=}"); shift ;;
    --oversubscribe) oversubscribe=1; shift ;;
    --allow-run-as-root) allow_root=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown argument '$1' (executor flags go after '--'; try --help)" ;;
  esac
done
executor_flags=("$@")

[[ -n "$np" ]] || die "--np K is required (try --help)"
[[ "$np" =~ ^[1-9][0-9]*$ ]] || die "--np must be a positive integer, not '$np'"
if [[ -n "$hostfile" ]]; then
  [[ -r "$hostfile" ]] || die "hostfile '$hostfile' does not exist or is not readable"
fi
if [[ ! -x "$executor" ]]; then
  if [[ -z "$hostfile" ]]; then
    die "executor '$executor' not found or not executable" \
      "(build it with: cmake --build build --target varipipe-executor, or pass --executor PATH)"
  fi
  echo "$me: warning: '$executor' is not executable here; it must exist on every host" >&2
fi
if [[ ${#executor_flags[@]} -eq 0 ]]; then
  echo "$me: warning: no executor flags after '--' (usually --planner HOST:PORT or --config/--plans)" >&2
fi
command -v mpirun >/dev/null 2>&1 ||
  die "mpirun not found (Open MPI; deploy/install-deps.sh installs it)"
if [[ ${EUID:-$(id -u)} -eq 0 && $allow_root -eq 0 ]]; then
  die "refusing to run as root; pass --allow-run-as-root explicitly if you mean it"
fi
for name in "${extra_env[@]}"; do
  [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "--env needs a variable name, not '$name'"
  [[ -v "$name" ]] || die "--env $name: the variable is not set"
done

# Variables the executor (LibTorch, NCCL, Gloo, the Redis password) may need on
# every host, exported only when set (mpirun warns about unset ones).
env_names=()
while IFS= read -r name; do
  case "$name" in
    VARIPIPE_*|NCCL_*|GLOO_*|TORCH_*|CUDA_VISIBLE_DEVICES|LD_LIBRARY_PATH|PATH|OMP_NUM_THREADS)
      env_names+=("$name") ;;
  esac
done < <(compgen -e | sort)
env_names+=("${extra_env[@]}")

cmd=(mpirun -np "$np" --map-by slot --bind-to none)
[[ $allow_root -eq 1 ]] && cmd+=(--allow-run-as-root)
[[ $oversubscribe -eq 1 ]] && cmd+=(--oversubscribe)
[[ -n "$hostfile" ]] && cmd+=(--hostfile "$hostfile")
declare -A seen=()
for name in "${env_names[@]}"; do
  [[ -n "${seen[$name]:-}" ]] && continue
  seen[$name]=1
  cmd+=(-x "$name")
done
cmd+=("${mpi_args[@]}" "$executor" "${executor_flags[@]}")

if [[ $dry_run -eq 1 ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
exec "${cmd[@]}"

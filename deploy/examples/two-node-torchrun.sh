#!/usr/bin/env bash
# Example: one job's executors on two nodes with torchrun's static rendezvous.
# Run it once on each node, with the same run id and master address:
#
#   # once, anywhere: a new run id for this launch (a relaunch needs a new one)
#   RUN_ID=myjob-$(date +%Y%m%d-%H%M%S)
#   node0$ deploy/examples/two-node-torchrun.sh --node-rank 0 --master-addr node0 \
#            --run-id "$RUN_ID" --nproc-per-node 8 -- --planner cpu0:50051 \
#            --token_file /shared/myjob.token
#   node1$ deploy/examples/two-node-torchrun.sh --node-rank 1 --master-addr node0 \
#            --run-id "$RUN_ID" --nproc-per-node 8 -- --planner cpu0:50051 \
#            --token_file /shared/myjob.token
#
# The token file is the daemon's --token_file (a 0600 file on storage both nodes read;
# docs/security.md): every call to the daemon carries it.
#
# Options (each also from the environment variable in brackets):
#   --node-rank N        0 on the master node, 1 on the other [NODE_RANK]
#   --master-addr HOST   address of node 0, reachable from node 1 [MASTER_ADDR]
#   --master-port PORT   torchrun's rendezvous port on node 0 [MASTER_PORT] (29500)
#   --run-id ID          the launch's run id, identical on both nodes and new for every
#                        launch: torchrun's --rdzv_id, which the executor takes as its
#                        rendezvous namespace in Redis (TORCHELASTIC_RUN_ID) [RUN_ID]
#   --nproc-per-node K   executors per node, one per GPU [NPROC_PER_NODE]
#                        (default: the GPUs nvidia-smi lists)
#   --executor PATH      [VARIPIPE_EXECUTOR] (default: build/bin/varipipe-executor)
#   --log-dir DIR        torchrun's per-worker log files [LOG_DIR] (default: torchrun's)
#   --dry-run            print the torchrun command instead of running it
# Everything after '--' goes to every executor (--planner HOST:PORT[,HOST:PORT],
# --token_file, --store_file, --log_level, ...). The job's pipeline x data must be 2 x K:
# node 0 runs global ranks 0..K-1, node 1 ranks K..2K-1.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
me=deploy/examples/two-node-torchrun.sh

die() { echo "$me: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

node_rank="${NODE_RANK:-}"
master_addr="${MASTER_ADDR:-}"
master_port="${MASTER_PORT:-29500}"
run_id="${RUN_ID:-}"
nproc="${NPROC_PER_NODE:-}"
executor="${VARIPIPE_EXECUTOR:-$root/build/bin/varipipe-executor}"
log_dir="${LOG_DIR:-}"
dry_run=0
need_value() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (try --help)"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --node-rank|--node_rank) need_value "$@"; node_rank="$2"; shift 2 ;;
    --master-addr|--master_addr) need_value "$@"; master_addr="$2"; shift 2 ;;
    --master-port|--master_port) need_value "$@"; master_port="$2"; shift 2 ;;
    --run-id|--run_id) need_value "$@"; run_id="$2"; shift 2 ;;
    --nproc-per-node|--nproc_per_node) need_value "$@"; nproc="$2"; shift 2 ;;
    --executor) need_value "$@"; executor="$2"; shift 2 ;;
    --log-dir|--log_dir) need_value "$@"; log_dir="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown argument '$1' (executor flags go after '--'; try --help)" ;;
  esac
done

[[ "$node_rank" == 0 || "$node_rank" == 1 ]] ||
  die "--node-rank (or NODE_RANK) must be 0 or 1, not '${node_rank}'"
[[ -n "$master_addr" ]] || die "--master-addr (or MASTER_ADDR) is required: node 0's address"
[[ "$master_port" =~ ^[0-9]+$ && "$master_port" -ge 1 && "$master_port" -le 65535 ]] ||
  die "--master-port must be a port number, not '$master_port'"
[[ -n "$run_id" ]] ||
  die "--run-id (or RUN_ID) is required: the same new id on both nodes, e.g. myjob-\$(date +%Y%m%d-%H%M%S)"
[[ "$run_id" =~ ^[A-Za-z0-9._-]{1,64}$ ]] ||
  die "--run-id '$run_id': use 1-64 letters, digits, '.', '_' or '-'"
if [[ -z "$nproc" ]]; then
  command -v nvidia-smi >/dev/null 2>&1 ||
    die "--nproc-per-node (or NPROC_PER_NODE) is required on a host without nvidia-smi"
  nproc=$(nvidia-smi -L | grep -c '^GPU ' || true)
  [[ "$nproc" -ge 1 ]] || die "nvidia-smi lists no GPU; pass --nproc-per-node"
fi
[[ "$nproc" =~ ^[1-9][0-9]*$ ]] || die "--nproc-per-node must be a positive integer, not '$nproc'"
[[ -x "$executor" ]] || die "executor '$executor' not found or not executable (--executor PATH)"
command -v torchrun >/dev/null 2>&1 || die "torchrun not found (deploy/install-deps.sh installs it)"

# Debian's torchrun (PyTorch 1.13) knows only the underscore spellings and crashes
# with its default --redirects/--tee under Python 3.11: --redirects 2 --tee 2 sends
# each worker's stderr to a log file and to the console (docs/development.md).
cmd=(torchrun --nnodes 2 --node_rank "$node_rank" --nproc_per_node "$nproc"
     --master_addr "$master_addr" --master_port "$master_port" --rdzv_id "$run_id"
     --redirects 2 --tee 2)
[[ -n "$log_dir" ]] && cmd+=(--log_dir "$log_dir")
cmd+=(--no_python "$executor" "$@")

if [[ $dry_run -eq 1 ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
echo "$me: node $node_rank of 2, $nproc executors (global ranks $((node_rank * nproc))..$((node_rank * nproc + nproc - 1))), run id $run_id" >&2
exec "${cmd[@]}"

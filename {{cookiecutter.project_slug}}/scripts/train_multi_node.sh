#!/usr/bin/env bash
# Train on several machines: run this once on every node, same CONFIG and flags,
# a different NODE_RANK on each. c10d rendezvous by default; static on request.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=_common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/_common.sh"

usage() {
  cat <<EOF
Usage: NODE_RANK=R MASTER_ADDR=HOST scripts/train_multi_node.sh [CONFIG] [--flag value ...]

Runs \`python -m $PACKAGE_NAME.train CONFIG --flag value ...\` under torchrun on
NNODES machines. Start it on every node with the same CONFIG, flags, NNODES,
MASTER_ADDR and MASTER_PORT; only NODE_RANK differs. CONFIG is a
.yaml/.yml/.json file such as configs/default.yaml; flags override its values.
List the flags with:
  PYTHONPATH=src python -m $PACKAGE_NAME.train --help

Environment:
  NODE_RANK        this node's rank, 0 .. NNODES-1 (0 on MASTER_ADDR). Required
                   by static rendezvous. Under c10d it only says which node hosts
                   the rendezvous store (0: this one); unset, torchrun decides
                   by matching the endpoint against this machine's names
  MASTER_ADDR      required: address of the NODE_RANK=0 node, reachable from all
                   (under c10d, not needed when RDZV_ENDPOINT is set)
  MASTER_PORT      free TCP port on MASTER_ADDR, 1024-65535  [default: $DEFAULT_MASTER_PORT]
  NNODES           number of nodes, N, or MIN:MAX for an elastic job that starts
                   with MIN nodes and admits up to MAX (c10d only)
                                                             [default: $DEFAULT_NNODES]
  RDZV_BACKEND     how the nodes meet                        [default: c10d]
                     c10d    a store on RDZV_ENDPOINT, hosted by torchrun on the
                             NODE_RANK=0 node; each attempt's workers get a
                             fresh store, so MAX_RESTARTS works; torchrun
                             numbers the nodes itself
                     static  every node waits at MASTER_ADDR:MASTER_PORT for all
                             NNODES; one store for all restarts, where restarted
                             workers may read stale addresses and fail to
                             connect (pytorch/pytorch#135712)
  RDZV_ENDPOINT    HOST:PORT of the c10d store     [default: MASTER_ADDR:MASTER_PORT]
  RDZV_ID          job id, the same on every node; nodes with another id are
                   not admitted                              [default: $PACKAGE_NAME]
  LOCAL_ADDR       this node's address as the other nodes reach it (c10d); set
                   it where host names do not resolve across nodes
                                                [default: this machine's FQDN]
  NPROC_PER_NODE   processes per node: 'auto' (one per visible GPU, 2 on a
                   CPU-only machine) or a number      [default: $DEFAULT_NPROC_PER_NODE]
  MAX_RESTARTS     times torchrun restarts the workers after a failure; they
                   resume from the newest checkpoint   [default: 0]
  TORCH_DISABLE_SHARE_RDZV_TCP_STORE  1 gives each restart a fresh store under
                   c10d rendezvous; static ignores it  [default: 1]
  OMP_NUM_THREADS  threads per process     [default: CPU cores / NPROC_PER_NODE]
  PYTHON           interpreter with torch installed  [default: python, else python3]
  MODULE           Python module run in every process [default: $PACKAGE_NAME.train];
                   MODULE=$PACKAGE_NAME.doctor checks versions, GPUs, the
                   network, the backend and output_dir with the same CONFIG and
                   flags, prints one PASS/FAIL line per check and trains nothing

Troubleshooting (hangs, NCCL errors, timeouts):
  NCCL_DEBUG=INFO                 log how NCCL picks interfaces and transports
  NCCL_DEBUG_SUBSYS=INIT,NET      keep that log to set-up and networking
  NCCL_SOCKET_IFNAME=eth0         use this network interface (see \`ip addr\`)
  NCCL_IB_DISABLE=1               rule out InfiniBand problems
  --ddp_timeout SECONDS           (a training flag) how long a collective may
                                  wait before the job fails instead of hanging
  A node that never joins leaves the others waiting at the rendezvous: check
  that MASTER_PORT is open between the nodes and that NNODES matches everywhere.
  Before a long job: MODULE=$PACKAGE_NAME.doctor with the same settings.

Example, two nodes:
  node A: NODE_RANK=0 MASTER_ADDR=nodeA scripts/train_multi_node.sh configs/default.yaml
  node B: NODE_RANK=1 MASTER_ADDR=nodeA scripts/train_multi_node.sh configs/default.yaml
Elastic, 2 to 4 nodes, surviving 3 failures: NNODES=2:4 MAX_RESTARTS=3 on every node.
Two nodes on one host: set OMP_NUM_THREADS=1 (each would claim all the cores).
EOF
}

if wants_help "$@"; then
  usage
  exit 0
fi

RDZV_BACKEND="${RDZV_BACKEND:-c10d}"
[[ "$RDZV_BACKEND" == c10d || "$RDZV_BACKEND" == static ]] \
  || die "RDZV_BACKEND='$RDZV_BACKEND' is not valid: expected c10d or static"
NNODES="${NNODES:-$DEFAULT_NNODES}"
# NNODES is N, or MIN:MAX (elastic, c10d only); MAX_NODES bounds NODE_RANK.
if [[ "$NNODES" == *:* ]]; then
  [[ "$RDZV_BACKEND" == c10d ]] \
    || die "NNODES='$NNODES' is a range, which needs RDZV_BACKEND=c10d: static rendezvous waits for exactly N nodes"
  MIN_NODES="${NNODES%%:*}" MAX_NODES="${NNODES#*:}"
  { is_int_in_range "$MIN_NODES" 1 && is_int_in_range "$MAX_NODES" "$((10#$MIN_NODES))"; } \
    || die "NNODES='$NNODES' is not valid: expected N or MIN:MAX with 1 <= MIN <= MAX, e.g. 2:4"
  MAX_NODES="$((10#$MAX_NODES))"
  NNODES="$((10#$MIN_NODES)):$MAX_NODES"
else
  require_int NNODES 1
  MAX_NODES="$NNODES"
fi
if [[ -n "${NODE_RANK:-}" ]]; then
  require_int NODE_RANK 0 "$((MAX_NODES - 1))"
elif [[ "$RDZV_BACKEND" == static ]]; then
  die "NODE_RANK is not set: set it to this node's rank, an integer from 0 to $((MAX_NODES - 1)) (0 on the MASTER_ADDR node)"
fi
MASTER_PORT="${MASTER_PORT:-$DEFAULT_MASTER_PORT}"
require_int MASTER_PORT 1024 65535
if [[ "$RDZV_BACKEND" == static ]]; then
  [[ -n "${MASTER_ADDR:-}" ]] \
    || die "MASTER_ADDR is not set: set it to the address of the NODE_RANK=0 node, reachable from every node"
elif [[ -z "${RDZV_ENDPOINT:-}" ]]; then
  [[ -n "${MASTER_ADDR:-}" ]] \
    || die "MASTER_ADDR is not set: set it to the address of the NODE_RANK=0 node, reachable from every node (or set RDZV_ENDPOINT=HOST:PORT)"
fi
RDZV_ENDPOINT="${RDZV_ENDPOINT:-${MASTER_ADDR:-}:$MASTER_PORT}"
RDZV_ID="${RDZV_ID:-$PACKAGE_NAME}"
[[ "$RDZV_ID" =~ ^[A-Za-z0-9_.-]+$ ]] \
  || die "RDZV_ID='$RDZV_ID' is not valid: use letters, digits, '.', '_' and '-' (the same on every node)"
check_config "$@"
resolve_launch_settings
preflight "$((MAX_NODES * NPROC_PER_NODE))" "$@"

cmd=("$PYTHON" -m "$PACKAGE_NAME.torchrun" --nnodes="$NNODES")
if [[ "$RDZV_BACKEND" == c10d ]]; then
  # c10d: torchrun on the NODE_RANK=0 node hosts the store at RDZV_ENDPOINT; the
  # others connect to it. Each attempt gets fresh worker addresses (see
  # disable_shared_rendezvous_store), so restarts connect.
  cmd+=(--rdzv-backend=c10d --rdzv-endpoint="$RDZV_ENDPOINT" --rdzv-id="$RDZV_ID")
  if [[ -n "${NODE_RANK:-}" ]]; then
    cmd+=(--rdzv-conf="is_host=$(( NODE_RANK == 0 ? 1 : 0 ))")
  fi
  if [[ -n "${LOCAL_ADDR:-}" ]]; then
    cmd+=(--local-addr="$LOCAL_ADDR")
  fi
else
  # Static: NODE_RANK=0 hosts the store on MASTER_ADDR:MASTER_PORT and every node
  # waits there until all NNODES have joined. Restarts reuse that store.
  cmd+=(--node-rank="$NODE_RANK" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT")
  if (( MAX_RESTARTS > 0 )); then
    printf 'warning: static rendezvous shares one store across restarts, where restarted workers can read stale addresses and fail to connect (pytorch/pytorch#135712); RDZV_BACKEND=c10d restarts reliably\n' >&2
  fi
fi
cmd+=(
  --nproc-per-node="$NPROC_PER_NODE"
  --max-restarts="$MAX_RESTARTS"
  -m "$MODULE"
  "$@"
)
run_command "${cmd[@]}"

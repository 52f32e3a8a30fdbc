#!/usr/bin/env bash
# Train on several machines: run this once on every node, same CONFIG and flags,
# a different NODE_RANK on each.
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
  NODE_RANK        required: this node's rank, 0 .. NNODES-1 (0 on MASTER_ADDR)
  MASTER_ADDR      required: address of the NODE_RANK=0 node, reachable from all
  MASTER_PORT      free TCP port on MASTER_ADDR, 1024-65535  [default: $DEFAULT_MASTER_PORT]
  NNODES           number of nodes                           [default: $DEFAULT_NNODES]
  NPROC_PER_NODE   processes per node: 'auto' (one per visible GPU, 2 on a
                   CPU-only machine) or a number      [default: $DEFAULT_NPROC_PER_NODE]
  MAX_RESTARTS     times torchrun restarts the workers after a failure [default: 0].
                   Unreliable here: the static rendezvous keeps one store, where
                   restarted workers may read stale addresses (pytorch/pytorch#135712)
  TORCH_DISABLE_SHARE_RDZV_TCP_STORE  1 gives each restart a fresh store under
                   c10d rendezvous; the static one here ignores it [default: 1]
  OMP_NUM_THREADS  threads per process     [default: CPU cores / NPROC_PER_NODE]
  PYTHON           interpreter with torch installed  [default: python, else python3]

Troubleshooting (hangs, NCCL errors, timeouts):
  NCCL_DEBUG=INFO                 log how NCCL picks interfaces and transports
  NCCL_DEBUG_SUBSYS=INIT,NET      keep that log to set-up and networking
  NCCL_SOCKET_IFNAME=eth0         use this network interface (see \`ip addr\`)
  NCCL_IB_DISABLE=1               rule out InfiniBand problems
  --ddp_timeout SECONDS           (a training flag) how long a collective may
                                  wait before the job fails instead of hanging
  A node that never joins leaves the others waiting at the rendezvous: check
  that MASTER_PORT is open between the nodes and that NNODES matches everywhere.

Example, two nodes:
  node A: NODE_RANK=0 MASTER_ADDR=nodeA scripts/train_multi_node.sh configs/default.yaml
  node B: NODE_RANK=1 MASTER_ADDR=nodeA scripts/train_multi_node.sh configs/default.yaml
Two nodes on one host: set OMP_NUM_THREADS=1 (each would claim all the cores).
EOF
}

if wants_help "$@"; then
  usage
  exit 0
fi

NNODES="${NNODES:-$DEFAULT_NNODES}"
require_int NNODES 1
[[ -n "${NODE_RANK:-}" ]] \
  || die "NODE_RANK is not set: set it to this node's rank, an integer from 0 to $((NNODES - 1)) (0 on the MASTER_ADDR node)"
require_int NODE_RANK 0 "$((NNODES - 1))"
[[ -n "${MASTER_ADDR:-}" ]] \
  || die "MASTER_ADDR is not set: set it to the address of the NODE_RANK=0 node, reachable from every node"
MASTER_PORT="${MASTER_PORT:-$DEFAULT_MASTER_PORT}"
require_int MASTER_PORT 1024 65535
check_config "$@"
resolve_launch_settings

# Static rendezvous: NODE_RANK=0 hosts the store on MASTER_ADDR:MASTER_PORT and
# every node waits there until all NNODES have joined. Restarts reuse that store.
cmd=(
  "$PYTHON" -m torch.distributed.run
  --nnodes="$NNODES"
  --node-rank="$NODE_RANK"
  --master-addr="$MASTER_ADDR"
  --master-port="$MASTER_PORT"
  --nproc-per-node="$NPROC_PER_NODE"
  --max-restarts="$MAX_RESTARTS"
  -m "$PACKAGE_NAME.train"
  "$@"
)
run_command "${cmd[@]}"

#!/usr/bin/env bash
# Train on several machines: run this on every node, a different NODE_RANK on each.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=_common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/_common.sh"

# The usage text; _common.sh adds the settings every launch script reads.
USAGE="Usage: NODE_RANK=R MASTER_ADDR=HOST scripts/train_multi_node.sh [CONFIG] [--flag value ...]

Runs \`python -m $PACKAGE_NAME.train CONFIG --flag value ...\` under torchrun on NNODES
machines. Start it on every node with the same CONFIG, flags and settings but NODE_RANK.

Example, two nodes (on one host, also OMP_NUM_THREADS=1: each node would claim all the cores):
  node A: NODE_RANK=0 MASTER_ADDR=nodeA scripts/train_multi_node.sh configs/default.yaml
  node B: NODE_RANK=1 MASTER_ADDR=nodeA scripts/train_multi_node.sh configs/default.yaml
Elastic, 2 to 4 nodes, surviving 3 failures: NNODES=2:4 MAX_RESTARTS=3 on every node.

Hangs, NCCL errors, timeouts: NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET log how NCCL picks
interfaces; NCCL_SOCKET_IFNAME=eth0 picks one (see \`ip addr\`); NCCL_IB_DISABLE=1 rules out
InfiniBand; the training flag --ddp_timeout SECONDS fails a collective that waits that long.
A node that never joins leaves the others waiting: check that MASTER_PORT is open between the
nodes and NNODES the same on all.{% if cookiecutter.include_doctor %} Before a long job: MODULE=$PACKAGE_NAME.doctor, same settings.{% endif %}

Environment:
  NODE_RANK        this node's rank, 0 .. NNODES-1 (0 on MASTER_ADDR). Static needs it; c10d
                   reads only whether this node hosts the store (unset: torchrun decides)
  MASTER_ADDR      address of the NODE_RANK=0 node, reachable from all (c10d: or set RDZV_ENDPOINT)
  MASTER_PORT      free TCP port on MASTER_ADDR, 1024-65535  [default: $DEFAULT_MASTER_PORT]
  NNODES           N, or MIN:MAX for an elastic job of MIN to MAX nodes (c10d only) [default: $DEFAULT_NNODES]
  RDZV_BACKEND     c10d (default): a store on RDZV_ENDPOINT, hosted by torchrun on the
                   NODE_RANK=0 node and fresh for each restart; torchrun numbers the nodes.
                   static: all NNODES meet at MASTER_ADDR:MASTER_PORT, and restarted workers
                   may read stale addresses from the shared store (pytorch/pytorch#135712)
  RDZV_ENDPOINT    HOST:PORT of the c10d store     [default: MASTER_ADDR:MASTER_PORT]
  RDZV_ID          job id, the same on every node (others are not admitted) [default: $PACKAGE_NAME]
  LOCAL_ADDR       this node's address as the others reach it (c10d), where host names
                   do not resolve across nodes    [default: this machine's FQDN]"

show_usage_if_asked "$@"

RDZV_BACKEND="${RDZV_BACKEND:-c10d}"
[[ "$RDZV_BACKEND" == c10d || "$RDZV_BACKEND" == static ]] \
  || die "RDZV_BACKEND='$RDZV_BACKEND' is not valid: expected c10d or static"
# NNODES is N, or MIN:MAX (elastic, c10d only); MAX_NODES bounds NODE_RANK.
NNODES="${NNODES:-$DEFAULT_NNODES}"
MIN_NODES="${NNODES%%:*}"
MAX_NODES="${NNODES#*:}"  # N too when NNODES is N
{ is_int_in_range "$MIN_NODES" 1 && is_int_in_range "$MAX_NODES" "$((10#$MIN_NODES))"; } \
  || die "NNODES='$NNODES' is not valid: expected N or MIN:MAX with 1 <= MIN <= MAX, e.g. 2:4"
if [[ "$NNODES" == *:* ]]; then
  [[ "$RDZV_BACKEND" == c10d ]] \
    || die "NNODES='$NNODES' is a range, which needs RDZV_BACKEND=c10d: static rendezvous waits for exactly N nodes"
  NNODES="$((10#$MIN_NODES)):$((10#$MAX_NODES))"
else
  NNODES="$((10#$NNODES))"
fi
MAX_NODES="$((10#$MAX_NODES))"
if [[ -n "${NODE_RANK:-}" ]]; then
  require_int NODE_RANK 0 "$((MAX_NODES - 1))"
elif [[ "$RDZV_BACKEND" == static ]]; then
  die "NODE_RANK is not set: set it to this node's rank, an integer from 0 to $((MAX_NODES - 1)) (0 on the MASTER_ADDR node)"
fi
MASTER_PORT="${MASTER_PORT:-$DEFAULT_MASTER_PORT}"
require_int MASTER_PORT 1024 65535
# Static rendezvous always meets at MASTER_ADDR; c10d there unless RDZV_ENDPOINT is set.
if [[ -z "${MASTER_ADDR:-}" && ( "$RDZV_BACKEND" == static || -z "${RDZV_ENDPOINT:-}" ) ]]; then
  die "MASTER_ADDR is not set: set it to the address of the NODE_RANK=0 node, reachable from every node (or, under c10d, set RDZV_ENDPOINT=HOST:PORT)"
fi
RDZV_ENDPOINT="${RDZV_ENDPOINT:-${MASTER_ADDR:-}:$MASTER_PORT}"
RDZV_ID="${RDZV_ID:-$PACKAGE_NAME}"
[[ "$RDZV_ID" =~ ^[A-Za-z0-9_.-]+$ ]] \
  || die "RDZV_ID='$RDZV_ID' is not valid: use letters, digits, '.', '_' and '-' (the same on every node)"
resolve_launch_settings "$@"
preflight "$((MAX_NODES * NPROC_PER_NODE))"

cmd=("$PYTHON" -m "$PACKAGE_NAME.torchrun" --nnodes="$NNODES")
if [[ "$RDZV_BACKEND" == c10d ]]; then
  # torchrun on the NODE_RANK=0 node hosts the store; the others connect to it.
  cmd+=(--rdzv-backend=c10d --rdzv-endpoint="$RDZV_ENDPOINT" --rdzv-id="$RDZV_ID")
  if [[ -n "${NODE_RANK:-}" ]]; then
    cmd+=(--rdzv-conf="is_host=$(( NODE_RANK == 0 ? 1 : 0 ))")
  fi
  if [[ -n "${LOCAL_ADDR:-}" ]]; then
    cmd+=(--local-addr="$LOCAL_ADDR")
  fi
else
  cmd+=(--node-rank="$NODE_RANK" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT")
  if (( MAX_RESTARTS > 0 )); then
    printf 'warning: static rendezvous shares one store across restarts, where restarted workers can read stale addresses and fail to connect (pytorch/pytorch#135712); RDZV_BACKEND=c10d restarts reliably\n' >&2
  fi
fi
cmd+=(--nproc-per-node="$NPROC_PER_NODE" --max-restarts="$MAX_RESTARTS" -m "$MODULE" "$@")
run_command "${cmd[@]}"

#!/usr/bin/env bash
# Train on this machine: one process per GPU (or 2 on CPU) under torchrun.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=_common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/_common.sh"

usage() {
  cat <<EOF
Usage: scripts/train_single_node.sh [CONFIG] [--flag value ...]

Runs \`python -m $PACKAGE_NAME.train CONFIG --flag value ...\` under torchrun on
this machine. CONFIG is a .yaml/.yml/.json file such as configs/default.yaml;
flags override its values. List the flags with:
  PYTHONPATH=src python -m $PACKAGE_NAME.train --help

Environment:
  NPROC_PER_NODE   processes to start: 'auto' (one per visible GPU, 2 on a
                   CPU-only machine) or a number      [default: $DEFAULT_NPROC_PER_NODE]
  MAX_RESTARTS     times torchrun restarts the workers after a failure [default: 0]
  TORCH_DISABLE_SHARE_RDZV_TCP_STORE  1 gives each restart a fresh rendezvous
                   store, so that restarted workers connect [default: 1]
  OMP_NUM_THREADS  threads per process     [default: CPU cores / NPROC_PER_NODE]
  PYTHON           interpreter with torch installed  [default: python, else python3]
  CUDA_VISIBLE_DEVICES restricts which GPUs are used (and counted by 'auto').
  MODULE           Python module run in every process [default: $PACKAGE_NAME.train];
                   MODULE=$PACKAGE_NAME.doctor checks versions, GPUs, the
                   network, the backend and output_dir with the same CONFIG and
                   flags, prints one PASS/FAIL line per check and trains nothing

Examples:
  scripts/train_single_node.sh configs/smoke.yaml
  NPROC_PER_NODE=4 scripts/train_single_node.sh configs/default.yaml --learning_rate 3e-5
  MODULE=$PACKAGE_NAME.doctor scripts/train_single_node.sh configs/default.yaml
EOF
}

if wants_help "$@"; then
  usage
  exit 0
fi

check_config "$@"
resolve_launch_settings
preflight "$NPROC_PER_NODE" "$@"

# --standalone runs the rendezvous on a free local port, so two runs on one
# machine do not collide.
cmd=(
  "$PYTHON" -m "$PACKAGE_NAME.torchrun"
  --standalone
  --nproc-per-node="$NPROC_PER_NODE"
  --max-restarts="$MAX_RESTARTS"
  -m "$MODULE"
  "$@"
)
run_command "${cmd[@]}"

#!/usr/bin/env bash
# Train on this machine: one process per GPU (or up to 2 on CPU) under torchrun.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=_common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/_common.sh"

# The usage text; _common.sh adds the settings every launch script reads.
USAGE="Usage: scripts/train_single_node.sh [CONFIG] [--flag value ...]

Runs \`python -m $PACKAGE_NAME.train CONFIG --flag value ...\` under torchrun on this machine.

Examples:
  scripts/train_single_node.sh configs/smoke.yaml
  NPROC_PER_NODE=4 scripts/train_single_node.sh configs/default.yaml --learning_rate 3e-5
{% if cookiecutter.include_doctor %}  MODULE=$PACKAGE_NAME.doctor scripts/train_single_node.sh configs/default.yaml
{% endif %}
Environment:"

show_usage_if_asked "$@"
resolve_launch_settings "$@"
preflight "$NPROC_PER_NODE"

# --standalone: the rendezvous on a free local port, so that two runs here do not collide.
cmd=("$PYTHON" -m "$PACKAGE_NAME.torchrun" --standalone)
cmd+=(--nproc-per-node="$NPROC_PER_NODE" --max-restarts="$MAX_RESTARTS" -m "$MODULE" "$@")
run_command "${cmd[@]}"

# shellcheck shell=bash
# Shared by the launch scripts: sourced, never executed. The template renders it:
# keep out the character pairs that open Jinja tags (brace-hash, brace-percent, double brace).

# Answers given when this repo was generated. Environment variables override them.
# shellcheck disable=SC2034  # read by the scripts that source this file
PACKAGE_NAME="{{ cookiecutter.package_name }}"
DEFAULT_NPROC_PER_NODE="{{ cookiecutter.nproc_per_node }}"
DEFAULT_NNODES="{{ cookiecutter.nnodes }}"
DEFAULT_MASTER_PORT="{{ cookiecutter.master_port }}"

# A checkout runs without `pip install`; an installed copy is found either way.
REPO_ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." >/dev/null && pwd)"
if [[ -d "$REPO_ROOT/src" ]]; then
  export PYTHONPATH="$REPO_ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
fi

die() {
  printf 'error: %s\n' "$*" >&2
  exit 1
}

# Under `set -e` a failing command (even a writer killed by SIGPIPE, 141) ends the script
# silently: name it. Inside a command substitution only exit, so the line is named once.
on_error() {
  local status=$? statuses="${PIPESTATUS[*]}"
  [[ "$BASHPID" == "$$" ]] || exit "$status"
  local where="${BASH_SOURCE[1]##*/} line ${BASH_LINENO[0]}"
  [[ "$statuses" != *' '* ]] || where+="; pipeline statuses: $statuses"
  printf "error: %s: '%s' failed with status %d (%s)\n" "${0##*/}" "$BASH_COMMAND" "$status" "$where" >&2
  exit "$status"
}
set -o errtrace  # the trap holds inside functions too
trap on_error ERR

# show_usage_if_asked ARGS...: when any argument is -h or --help, print the script's
# USAGE (ending in its own environment variables), then what every script reads; exit.
# One write, so that a reader such as `head` cannot cut it in two and break the pipe.
show_usage_if_asked() {
  local arg
  for arg in "$@"; do
    if [[ "$arg" == -h || "$arg" == --help ]]; then
      cat <<EOF
$USAGE
  NPROC_PER_NODE   processes per node: 'auto' (one per visible GPU; with none, 2 on a
                   CPU machine of 2+ cores, an error in a SLURM job) or a number [default: $DEFAULT_NPROC_PER_NODE]
  CUDA_VISIBLE_DEVICES  restricts which GPUs are used (and counted by 'auto')
  MAX_RESTARTS     times torchrun restarts the workers after a failure; they resume from
                   the newest checkpoint                                 [default: 0]
  TORCH_DISABLE_SHARE_RDZV_TCP_STORE  1 gives each restart a fresh rendezvous store, so
                   that restarted workers connect (static rendezvous ignores it) [default: 1]
  OMP_NUM_THREADS  threads per process [default: the CPUs this script may use / NPROC_PER_NODE]
  PYTHON           interpreter with torch installed  [default: python, else python3]
  PREFLIGHT        0 skips the check of the settings and data before the workers start
  MODULE           Python module run in every process [default: $PACKAGE_NAME.train]{% if cookiecutter.include_doctor %};
                   $PACKAGE_NAME.doctor checks the set-up (versions, GPUs, network, backend,
                   output_dir) with the same CONFIG and flags, and trains nothing{% endif %}

CONFIG is a .yaml/.yml/.json file such as configs/default.yaml; flags override its
values. List the flags with: PYTHONPATH=src python -m $PACKAGE_NAME.train --help
EOF
      exit 0
    fi
  done
}

# is_int_in_range VALUE MIN [MAX]: VALUE is a whole number, MIN <= VALUE <= MAX.
is_int_in_range() {
  [[ "$1" =~ ^[0-9]{1,9}$ ]] && (( 10#$1 >= $2 )) && (( 10#$1 <= ${3:-999999999} ))
}

# require_int NAME MIN [MAX]: the variable NAME must hold a whole number in
# [MIN, MAX]; it is rewritten in plain decimal ("08" becomes 8).
require_int() {
  local name="$1"
  local value="${!name-}" expected="an integer >= $2"
  [[ -z "${3:-}" ]] || expected="an integer from $2 to $3"
  is_int_in_range "$value" "$2" "${3:-}" || die "$name='$value' is not valid: expected $expected"
  printf -v "$name" '%d' "$((10#$value))"
}

cpu_count() {
  nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1
}

# NPROC_PER_NODE: a number, or 'auto' for one process per visible GPU.
resolve_nproc_per_node() {
  NPROC_PER_NODE="${NPROC_PER_NODE:-$DEFAULT_NPROC_PER_NODE}"
  if [[ "$NPROC_PER_NODE" == auto ]]; then
    local gpus
    gpus="$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')" \
      || die "NPROC_PER_NODE=auto could not count GPUs with $PYTHON (is torch installed?): set NPROC_PER_NODE to a number"
    if [[ "$gpus" =~ ^[1-9][0-9]*$ ]]; then
      NPROC_PER_NODE="$gpus"
    elif [[ -n "${SLURM_JOB_ID:-}" ]]; then
      # A GPU job that forgot to ask for GPUs would otherwise train on the CPUs for days.
      die "NPROC_PER_NODE=auto found no GPU in this SLURM job: request GPUs (#SBATCH --gpus-per-node) or set NPROC_PER_NODE to a number"
    else
      # No GPU. Two processes still exercise DDP; more than the cores just contend.
      NPROC_PER_NODE="$(( $(cpu_count) >= 2 ? 2 : 1 ))"
    fi
  fi
  is_int_in_range "$NPROC_PER_NODE" 1 \
    || die "NPROC_PER_NODE='$NPROC_PER_NODE' is not valid: expected 'auto' or an integer >= 1"
  NPROC_PER_NODE="$((10#$NPROC_PER_NODE))"
}

# resolve_launch_settings ARGS...: check CONFIG (the first of ARGS) and the settings every
# script reads. Call it after the script's own checks: NPROC_PER_NODE=auto imports torch.
resolve_launch_settings() {
  # A config file ends in .yaml, .yml or .json; other arguments go to the module untouched.
  local first="${1:-}"
  if [[ "$first" != -* && "$first" =~ \.(yaml|yml|json)$ && ! -f "$first" ]]; then
    die "config file '$first' not found (from $PWD): pass an existing .yaml/.yml/.json file, e.g. configs/default.yaml"
  fi
  MODULE="${MODULE:-$PACKAGE_NAME.train}"
  # A file name (train.py) would also match the pattern, and python -m would not find it.
  [[ "$MODULE" =~ ^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$ && "$MODULE" != *.py ]] \
    || die "MODULE='$MODULE' is not a Python module name: expected e.g. $PACKAGE_NAME.train{% if cookiecutter.include_doctor %} or $PACKAGE_NAME.doctor{% endif %}"
  if [[ -z "${PYTHON:-}" ]]; then
    PYTHON=python
    command -v python >/dev/null || PYTHON=python3
  fi
  command -v "$PYTHON" >/dev/null \
    || die "PYTHON='$PYTHON' is not a command: activate the environment that has torch, or set PYTHON=/path/to/python"
  MAX_RESTARTS="${MAX_RESTARTS:-0}"
  require_int MAX_RESTARTS 0
  resolve_nproc_per_node
  # Share the cores between this node's processes (torchrun would give each 1), unless set.
  if [[ -z "${OMP_NUM_THREADS:-}" ]]; then
    local threads=$(( $(cpu_count) / NPROC_PER_NODE ))
    export OMP_NUM_THREADS="$(( threads > 1 ? threads : 1 ))"
  fi
  # Restarted workers would read the previous attempt's addresses from the store torchrun
  # shares with them and fail to connect (pytorch/pytorch#135712): a fresh store per attempt.
  export TORCH_DISABLE_SHARE_RDZV_TCP_STORE="${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}"
}

# preflight WORLD_SIZE: have the launcher ($PACKAGE_NAME.torchrun) check the settings and the data for
# WORLD_SIZE processes before it starts any worker, so that a bad setting ends with one error line
# (exit status 2), not one per worker. It checks in the process the workers are forked from: the
# imports are paid once.
preflight() {
  [[ "$MODULE" == "$PACKAGE_NAME.train" && "${PREFLIGHT:-1}" != 0 ]] || return 0
  export PREFLIGHT_WORLD_SIZE="$1"
}

# Prints the command on stderr, after checking that its program exists.
show_command() {
  command -v "$1" >/dev/null \
    || die "'$1' is not a command here (not on PATH, or not executable): nothing was started"
  printf '+%s\n' "$(printf ' %q' "$@")" >&2
}

# show_command, then exec: signals (Ctrl-C, a scheduler's SIGTERM) reach torchrun directly.
run_command() {
  show_command "$@"
  exec "$@"
}

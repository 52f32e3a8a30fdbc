# shellcheck shell=bash
# Shared by the launch scripts: sourced, never executed.
# Keep this file free of the character pairs that open Jinja tags (brace-hash,
# brace-percent, double brace): the template renders it.

# Answers given when this repo was generated. Environment variables override them.
# shellcheck disable=SC2034  # read by the scripts that source this file
PACKAGE_NAME="{{ cookiecutter.package_name }}"
DEFAULT_NPROC_PER_NODE="{{ cookiecutter.nproc_per_node }}"
DEFAULT_NNODES="{{ cookiecutter.nnodes }}"
DEFAULT_MASTER_PORT="{{ cookiecutter.master_port }}"

REPO_ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." >/dev/null && pwd)"

# A checkout runs without `pip install`; an installed copy is found either way.
if [[ -d "$REPO_ROOT/src" ]]; then
  export PYTHONPATH="$REPO_ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
fi

die() {
  printf 'error: %s\n' "$*" >&2
  exit 1
}

# Under `set -e` a failing command ends the script with its status and no word
# of what failed (a pipe closed early even kills the writer with SIGPIPE, 141).
# Name the command instead. errtrace extends the trap into functions; inside a
# command substitution it only exits, so that the line that used it is named once.
on_error() {
  local status=$? statuses="${PIPESTATUS[*]}"
  if [[ "$BASHPID" != "$$" ]]; then
    exit "$status"
  fi
  local where="${BASH_SOURCE[1]##*/} line ${BASH_LINENO[0]}"
  if [[ "$statuses" == *' '* ]]; then
    where+="; pipeline statuses: $statuses"
  fi
  printf "error: %s: '%s' failed with status %d (%s)\n" "${0##*/}" "$BASH_COMMAND" "$status" "$where" >&2
  exit "$status"
}
set -o errtrace
trap on_error ERR

# is_int_in_range VALUE MIN [MAX]: VALUE is a whole number, MIN <= VALUE <= MAX.
is_int_in_range() {
  [[ "$1" =~ ^[0-9]{1,9}$ ]] || return 1
  (( 10#$1 >= $2 )) || return 1
  [[ -z "${3:-}" ]] || (( 10#$1 <= $3 ))
}

# require_int NAME MIN [MAX]: the variable NAME must hold a whole number in
# [MIN, MAX]; it is rewritten in plain decimal ("08" becomes 8).
require_int() {
  local name="$1" min="$2" max="${3:-}"
  local value="${!name-}" expected="an integer >= $min"
  if [[ -n "$max" ]]; then
    expected="an integer from $min to $max"
  fi
  is_int_in_range "$value" "$min" "$max" \
    || die "$name='$value' is not valid: expected $expected"
  printf -v "$name" '%d' "$((10#$value))"
}

# True when any argument asks for help.
wants_help() {
  local arg
  for arg in "$@"; do
    if [[ "$arg" == -h || "$arg" == --help ]]; then
      return 0
    fi
  done
  return 1
}

# The first argument is a config file when it ends in .yaml, .yml or .json;
# everything else goes to the training script untouched.
check_config() {
  local first="${1:-}"
  if [[ "$first" != -* && "$first" =~ \.(yaml|yml|json)$ && ! -f "$first" ]]; then
    die "config file '$first' not found (from $PWD): pass an existing .yaml/.yml/.json file, e.g. configs/default.yaml"
  fi
}

resolve_python() {
  if [[ -z "${PYTHON:-}" ]]; then
    PYTHON=python
    if ! command -v python >/dev/null; then
      PYTHON=python3
    fi
  fi
  command -v "$PYTHON" >/dev/null \
    || die "PYTHON='$PYTHON' is not a command: activate the environment that has torch, or set PYTHON=/path/to/python"
}

# MODULE: what torchrun runs in every process; the doctor checks the set-up instead of training.
resolve_module() {
  MODULE="${MODULE:-$PACKAGE_NAME.train}"
  # A file name (train.py) would also match the pattern, and python -m would not find it.
  [[ "$MODULE" =~ ^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$ && "$MODULE" != *.py ]] \
    || die "MODULE='$MODULE' is not a Python module name: expected e.g. $PACKAGE_NAME.train or $PACKAGE_NAME.doctor"
}

resolve_max_restarts() {
  MAX_RESTARTS="${MAX_RESTARTS:-0}"
  require_int MAX_RESTARTS 0
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
    elif (( $(cpu_count) >= 2 )); then
      # No GPU. Two processes still exercise DDP; more than the cores just contend.
      NPROC_PER_NODE=2
    else
      NPROC_PER_NODE=1
    fi
  fi
  is_int_in_range "$NPROC_PER_NODE" 1 \
    || die "NPROC_PER_NODE='$NPROC_PER_NODE' is not valid: expected 'auto' or an integer >= 1"
  NPROC_PER_NODE="$((10#$NPROC_PER_NODE))"
}

# Share the cores between the processes of this node, unless the user chose.
# (torchrun would otherwise set 1 thread per process and print a warning.)
set_omp_num_threads() {
  if [[ -z "${OMP_NUM_THREADS:-}" ]]; then
    local threads=$(( $(cpu_count) / NPROC_PER_NODE ))
    export OMP_NUM_THREADS="$(( threads > 1 ? threads : 1 ))"
  fi
}

# Restarted workers (MAX_RESTARTS > 0) read the previous attempt's addresses
# from the rendezvous store torchrun shares with them, and fail to connect
# (pytorch/pytorch#135712; NCCL reads a stale unique id the same way). With
# sharing off, each attempt gets a fresh store. A value the user set is kept.
# Only c10d rendezvous (--standalone, train_multi_node.sh by default, SLURM)
# reads it; static rendezvous does not.
disable_shared_rendezvous_store() {
  export TORCH_DISABLE_SHARE_RDZV_TCP_STORE="${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}"
}

# Sets MODULE, PYTHON, NPROC_PER_NODE, MAX_RESTARTS, OMP_NUM_THREADS and
# TORCH_DISABLE_SHARE_RDZV_TCP_STORE. Call it after the cheap checks:
# NPROC_PER_NODE=auto imports torch.
resolve_launch_settings() {
  resolve_module
  resolve_python
  resolve_max_restarts
  resolve_nproc_per_node
  set_omp_num_threads
  disable_shared_rendezvous_store
}

# preflight WORLD_SIZE ARGS...: check the settings and the data in one process
# before torchrun starts any worker (python -m PACKAGE.preflight), so that a bad
# setting ends with one error line instead of one per worker and torchrun's
# traceback. Only for the train module; PREFLIGHT=0 skips it.
preflight() {
  local world_size="$1" status=0
  shift
  if [[ "$MODULE" != "$PACKAGE_NAME.train" || "${PREFLIGHT:-1}" == 0 ]]; then
    return 0
  fi
  PREFLIGHT_WORLD_SIZE="$world_size" "$PYTHON" -m "$PACKAGE_NAME.preflight" "$@" || status=$?
  if (( status == 2 )); then
    exit 2  # a bad setting: preflight printed its error line
  elif (( status != 0 )); then
    die "the preflight check ($PYTHON -m $PACKAGE_NAME.preflight) failed with status $status: nothing was started"
  fi
}

# Prints the command on stderr, after checking that its program exists.
show_command() {
  command -v "$1" >/dev/null \
    || die "'$1' is not a command here (not on PATH, or not executable): nothing was started"
  printf '+' >&2
  printf ' %q' "$@" >&2
  printf '\n' >&2
}

# show_command, then replace this shell with the command, so that signals
# (Ctrl-C, a scheduler's SIGTERM) reach torchrun directly.
run_command() {
  show_command "$@"
  exec "$@"
}

#!/usr/bin/env bash
# The GPU check for both training loops, in one script for a bare CUDA machine (see --help).
set -euo pipefail

BENCH_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" >/dev/null && pwd)"
# The whole check, installs included, must end within 9.5 minutes (GPU_CHECK_BUDGET_SECONDS: another limit).
BUDGET_SECONDS="${GPU_CHECK_BUDGET_SECONDS:-570}"
# What the rendered projects need (their pyproject.toml, less torch), and cookiecutter to render them.
REQUIREMENTS=("transformers>=5.24,<6" "accelerate>=1.1,<2" "datasets>=4.0,<6" "safetensors>=0.4" "pyyaml>=6.0"
  "tqdm>=4.66" "numpy>=1.26")
RENDER_REQUIREMENT="cookiecutter>=2.7,<3"

usage() {
  cat <<'EOF'
Usage: bench/gpu_check.sh [--cpu] [--rendered DIR] [--workdir DIR] [--json FILE]
       bench/gpu_check.sh --render-only DIR

On a CUDA machine (one GPU is enough), with no Hugging Face Hub access, in at
most 9.5 minutes:
  1. renders both training loops, writes synthetic imdb-like data and a
     bert-base-sized model built from a config (saved in float32, float16 and
     bfloat16);
  2. trains each loop for one epoch through its scripts/train_single_node.sh
     (1 process, nccl, bf16) and reports samples/s and model-FLOPs utilisation
     against the GPU's dense bf16 peak (native >= Trainer), beside
     bench/compute_limit.py's bare eager loop on the same examples; then profiles
     10 steps of each loop (torch.profiler): host and GPU time a step, GPU idle,
     kernel launches, host syncs;
  3. trains each loop a few steps from the float16 checkpoint with
     --mixed_precision fp16 and from the bfloat16 one with --mixed_precision bf16,
     and reports pass or fail per run;
  4. on a machine with 2 or more GPUs, trains each loop 20 steps as users launch
     it there (NPROC_PER_NODE=auto: one process per GPU, nccl), and reports
     pass or fail;
  5. trains each loop again as in 2, with --torch_compile true (targets: MFU
     native >= 40%, Trainer >= 35%), if the budget leaves time for it;
  6. trains each loop 20 steps with --fsdp true on every GPU, even one (FSDP2,
     bf16; it must log its sharding over every GPU and leave checkpoint-20 and
     the gathered final model), then again from a copy of its checkpoint-10
     alone (it must resume there and end at step 20), reports pass or fail and
     how far the resumed run's weights are from the first's, if the budget
     leaves time for it.
Prints markdown tables and writes JSON (default: bench/results/gpu_check.json).
Exits 1, after an "error:" line, when anything failed.

Needs python3 >= 3.10 with pip. Packages already importable are used; missing
ones go into a virtual environment in the work folder that also sees the
system's packages (so an installed CUDA torch is kept): torch from pip's default
index, the rendered projects' requirements, and cookiecutter to render them.

Options:
  --cpu              tiny sizes on the CPU (gloo, fp32; the float16 checkpoint
                     trains with --mixed_precision no, fp16 being CUDA-only):
                     checks this script's logic on a machine without a GPU
                     (steps 4 and 6 on 2 CPU processes; --fsdp in the native
                     loop only, as the Trainer refuses it on CPU)
  --rendered DIR     use projects rendered earlier with --render-only, so this
                     machine needs no cookiecutter
  --render-only DIR  render both loops into DIR and stop
  --workdir DIR      scratch folder, kept afterwards [default: a temporary one]
  --json FILE        where the JSON goes
  -h, --help         this text

Environment:
  PYTHON             interpreter [default: python3]
  PEAK_BF16_TFLOPS   the GPU's dense bf16 peak in TFLOP/s, for a GPU the check
                     does not know (it knows the A10 to B200 data-centre GPUs)
  GPU_CHECK_BUDGET_SECONDS  the check's time limit, installs included [default: 570]
EOF
}

die() {
  printf 'error: %s\n' "$*" >&2
  exit 1
}

on_error() {
  local status=$?
  printf "error: gpu_check.sh: '%s' failed with status %d (line %d)\n" "$BASH_COMMAND" "$status" "${BASH_LINENO[0]}" >&2
  exit "$status"
}
set -o errtrace
trap on_error ERR

cpu=0
rendered=""
render_only=""
workdir=""
passthrough=()
while (($#)); do
  case "$1" in
    -h | --help)
      usage
      exit 0
      ;;
    --cpu)
      cpu=1
      passthrough+=("$1")
      shift
      ;;
    --rendered | --render-only | --workdir | --json)
      (($# >= 2)) || die "$1 needs a value; see --help"
      case "$1" in
        --rendered) rendered="$2" ;;
        --render-only) render_only="$2" ;;
        --workdir) workdir="$2" ;;
      esac
      passthrough+=("$1" "$2")
      shift 2
      ;;
    *) die "unknown argument '$1'; see --help" ;;
  esac
done
if [[ -n "$rendered" && ! -d "$rendered" ]]; then
  die "--rendered $rendered is not a folder; make it with: bench/gpu_check.sh --render-only DIR"
fi

PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null || die "PYTHON='$PYTHON' is not a command: install python3 >= 3.10, or set PYTHON"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || die "$PYTHON is older than Python 3.10, which the rendered projects need: set PYTHON to a newer one"

if [[ -z "$workdir" ]]; then
  workdir="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
  trap 'rm -rf -- "$workdir"' EXIT
  passthrough+=(--workdir "$workdir/run")
fi
mkdir -p -- "$workdir"

# missing_requirements PYTHON REQUIREMENT...: prints the requirements that the interpreter
# lacks, or has in a version outside the range, one a line.
missing_requirements() {
  local python="$1"
  shift
  "$python" - "$@" <<'EOF'
import importlib.metadata as metadata
import re
import sys


def version(text):
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


for requirement in sys.argv[1:]:
    name = re.match(r"[A-Za-z0-9_.-]+", requirement).group()
    try:
        installed = version(metadata.version(name))
    except metadata.PackageNotFoundError:
        print(requirement)
        continue
    for operator, wanted in re.findall(r"(>=|<|==)([0-9.]+)", requirement):
        ok = {">=": installed >= version(wanted), "<": installed < version(wanted), "==": installed == version(wanted)}
        if not ok[operator]:
            print(requirement)
            break
EOF
}

ensure_packages() {
  local wanted=("${REQUIREMENTS[@]}")
  if [[ -z "$rendered" ]]; then
    wanted+=("$RENDER_REQUIREMENT")
  fi
  local missing torch_missing=0 listed
  missing="$(missing_requirements "$PYTHON" "${wanted[@]}")" \
    || die "could not list the installed packages with $PYTHON"
  "$PYTHON" -c 'import torch' 2>/dev/null || torch_missing=1
  if [[ -z "$missing" && "$torch_missing" == 0 ]]; then
    return
  fi
  local venv="$workdir/venv"
  listed="${missing//$'\n'/ }"
  if ((torch_missing)); then
    listed="torch $listed"
  fi
  echo "installing into $venv: $listed" >&2
  if [[ ! -x "$venv/bin/python" ]]; then
    "$PYTHON" -m venv --system-site-packages "$venv" \
      || die "could not create a virtual environment with $PYTHON (Debian and Ubuntu: apt install python3-venv); or install these first: $listed"
  fi
  PYTHON="$venv/bin/python"
  if ((torch_missing)); then
    "$PYTHON" -m pip install --quiet torch \
      || die "pip could not install torch from its default index (no network?): install a CUDA build of torch first"
  fi
  if [[ -n "$missing" ]]; then
    local specs
    mapfile -t specs <<<"$missing"
    "$PYTHON" -m pip install --quiet "${specs[@]}" \
      || die "pip could not install ${specs[*]} (no network?): install them first, or render elsewhere and pass --rendered"
  fi
}

ensure_packages
if [[ -n "$render_only" ]]; then
  "$PYTHON" "$BENCH_DIR/gpu_check.py" "${passthrough[@]}" || die "rendering into $render_only failed"
  exit 0
fi

# Stop the Python part in time to say so, rather than be cut off without a word.
left=$((BUDGET_SECONDS - SECONDS))
((left > 60)) || die "installing took $SECONDS s, leaving too little of the $BUDGET_SECONDS s budget for the check"
status=0
GPU_CHECK_SECONDS_LEFT="$left" timeout --signal=INT --kill-after=15 "$left" "$PYTHON" "$BENCH_DIR/gpu_check.py" "${passthrough[@]}" || status=$?
if ((status == 124 || status == 137)); then
  die "the check did not finish within its $BUDGET_SECONDS s budget (installs included)"
elif ((status != 0)); then
  die "gpu_check.py exited with status $status (see the error lines above)"
fi
if ((cpu)); then
  echo "note: --cpu checked the logic only; run without it on a CUDA GPU for the figures" >&2
fi

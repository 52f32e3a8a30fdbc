#!/usr/bin/env bash
# Both loops' tests, and the template's proofs but SLURM's, on the oldest torch the rendered
# pyproject.toml admits (or TORCH_VERSION): does its floor hold? Not part of `make test`: pip's torch of
# an older release is a CUDA build, several GB to download. Run from the template's root, with its .venv
# (cookiecutter); about 20 minutes on 2 CPU cores, downloads included.
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/.."

WORK="${WORK:-/tmp/oldest-torch}"
FLOOR="$(sed -n 's/^ *"torch>=\([0-9.]*\)".*/\1/p' '{{cookiecutter.project_slug}}/pyproject.toml')"
TORCH_VERSION="${TORCH_VERSION:-$FLOOR.0}"
PROOFS_NOT_RUN=(test_slurm.py test_slurm_cluster.py slurm_cluster.py slow_steps.py)
# Copied with the proofs and their helpers, then removed: the folders' READMEs and the fault matrix's runner.
NOT_COPIED=(README.md fault_inject.py)

rm -rf "$WORK" && mkdir -p "$WORK"
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install --quiet "torch==$TORCH_VERSION" >> "$WORK/pip.log" 2>&1
status=0
for loop in native trainer; do
  # With LoRA, the doctor and FSDP, which the proofs train and run (as the suite renders of tests/template/test_render.py).
  .venv/bin/cookiecutter --no-input . -o "$WORK/$loop" training_loop="$loop" include_lora=true include_doctor=true \
    include_fsdp=true >/dev/null
  project="$WORK/$loop/text-classifier"
  "$WORK/venv/bin/python" -m pip install --quiet -e "${project}[dev]" >> "$WORK/pip.log" 2>&1
  cp -r tests/proofs/. tests/support/. "$project/tests/"
  (cd "$project/tests" && rm -f "${PROOFS_NOT_RUN[@]}" "${NOT_COPIED[@]}")
  [[ "$loop" == native ]] || rm -f "$project/tests/test_fsdp.py" "$project/tests/test_native_resume.py"
  echo "== $loop loop, torch $("$WORK/venv/bin/python" -c 'import torch; print(torch.__version__)')"
  if ! (cd "$project" && OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 make test-all PYTHON="$WORK/venv/bin/python" \
        ARGS="-q -p no:cacheprovider -p proof_scheduling" > "$WORK/$loop.log" 2>&1); then
    status=1
  fi
  grep -E "^(FAILED|ERROR) |[0-9]+ (passed|failed)" "$WORK/$loop.log" || true
done
exit "$status"

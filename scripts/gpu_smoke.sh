#!/usr/bin/env bash
# One command for a person with one GPU: installs the gpu extra in .venv-gpu (scripts/setup.sh --gpu), then
# runs every joint of the GPU path on tiny random paper-family models (no download): LineupRL, RubiCap and MoCo Rubric
# for 2 steps each with vLLM rollouts, LineupRL under DeepSpeed ZeRO-3, and bench/gpu_verifier.py. Writes
# one report (pass/fail per joint, seconds, device): runs/gpu-smoke/report.md (and report.json).
#
#   scripts/gpu_smoke.sh                 # on the GPU machine (expected: under 10 minutes on one H200)
#   scripts/gpu_smoke.sh --dry-run       # on a CPU: the same joints without the device and vLLM
#   scripts/gpu_smoke.sh --no-install    # skip setup.sh (.venv-gpu is already built)
# Other arguments go to scripts/gpu_smoke.py (--out DIR, --timeout S, --only JOINT...).
set -euo pipefail
cd "$(dirname "$0")/.."
install=1
dry=0
args=()
for a in "$@"; do
  case "$a" in
    --dry-run) install=0; dry=1; args+=("$a") ;;
    --no-install) install=0 ;;
    *) args+=("$a") ;;
  esac
done
if [ "$install" = 1 ]; then
  bash scripts/setup.sh --gpu  # builds and checks .venv-gpu (never touches .venv); refuses on a machine without a GPU
fi
PY=${PYTHON:-.venv/bin/python}
if [ -z "${PYTHON:-}" ] && [ "$dry" = 0 ] && [ -f .venv-gpu/captionrl-gpu-ready ]; then
  PY=.venv-gpu/bin/python  # the GPU environment setup.sh --gpu built and checked
fi
[ -x "$PY" ] || PY=python3
exec "$PY" scripts/gpu_smoke.py "${args[@]}"

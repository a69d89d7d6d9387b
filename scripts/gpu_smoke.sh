#!/usr/bin/env bash
# One command for a person with one GPU: installs the gpu extra (scripts/setup.sh --gpu), then runs every
# joint of the GPU path on tiny random paper-family models (no download): LineupRL, RubiCap and MoCo Rubric
# for 2 steps each with vLLM rollouts, LineupRL under DeepSpeed ZeRO-3, and bench/gpu_verifier.py. Writes
# one report (pass/fail per joint, seconds, device): runs/gpu-smoke/report.md (and report.json).
#
#   scripts/gpu_smoke.sh                 # on the GPU machine (expected: under 10 minutes on one H200)
#   scripts/gpu_smoke.sh --dry-run       # on a CPU: the same joints without the device and vLLM
#   scripts/gpu_smoke.sh --no-install    # skip setup.sh (the gpu extra is already installed)
# Other arguments go to scripts/gpu_smoke.py (--out DIR, --timeout S, --only JOINT...).
set -euo pipefail
cd "$(dirname "$0")/.."
install=1
args=()
for a in "$@"; do
  case "$a" in
    --dry-run) install=0; args+=("$a") ;;
    --no-install) install=0 ;;
    *) args+=("$a") ;;
  esac
done
if [ "$install" = 1 ]; then
  scripts/setup.sh --gpu
fi
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
exec "$PY" scripts/gpu_smoke.py "${args[@]}"

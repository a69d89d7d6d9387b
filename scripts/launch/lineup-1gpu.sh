#!/usr/bin/env bash
# LineupRL (configs/lineup-paper.yaml) on one GPU (80-141 GB): the frozen verifier served by vLLM on the GPU,
# then RLOO training under DeepSpeed ZeRO-2 in one process (float32 master weights for the bf16 policy) with
# vLLM rollouts colocated; the server is stopped when the script ends, however it ends.
#
#   scripts/launch/lineup-1gpu.sh                      # train; key=value arguments go to captionrl train
#   scripts/launch/lineup-1gpu.sh --dry-run            # print every command, start nothing
#
# The held-out evaluation verifiers (GLM-4-9B, Phi-4) do not fit beside the training: this run trains with
# eval.enabled=false; evaluate afterwards (docs/lineup-paper-eval.md) or on a node (lineup-node.sh).
# Overrides: GPU (0), VERIFIER_MODEL, VERIFIER_ARGS, VERIFIER_MEMORY (0.35 of the GPU), TRAIN_VLLM_MEMORY (0.2),
# CONFIG; the rest in scripts/launch/common.sh.
source "$(dirname "$0")/common.sh"
launch_init "LineupRL, one GPU" "$@"
CONFIG=${CONFIG:-configs/lineup-paper.yaml}
GPU=${GPU:-0}
serve verifier verifier "$GPU" Qwen/Qwen2.5-14B-Instruct --gpu-memory-utilization "${VERIFIER_MEMORY:-0.35}"
start_servers lineup "$CONFIG" eval.enabled=false
run_captionrl "$GPU" "accelerate configs/accelerate/multi-gpu-zero2.yaml 1" train lineup --config "$CONFIG" \
  eval.enabled=false "train.vllm_gpu_memory_utilization=${TRAIN_VLLM_MEMORY:-0.2}"
stop_servers

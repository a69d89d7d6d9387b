#!/usr/bin/env bash
# LineupRL (configs/lineup-paper.yaml) on one 8-GPU node: GPUs 0-1 serve the frozen Qwen2.5-14B verifier
# (vLLM, data-parallel over both), GPU 2 GLM-4-9B and GPU 3 Phi-4 (the held-out evaluation verifiers of
# Table 1), GPUs 4-7 train (RLOO, DeepSpeed ZeRO-2, vLLM rollouts colocated at the preset's 0.3); checkpoint
# selection and the held-out evaluation run at the end of training. Every server is stopped when the script
# ends. Before anything starts, `captionrl plan` plans the 4 training GPUs (docs/gpu.md, "Memory plan") and
# a plan that does not fit stops the launch.
#
#   scripts/launch/lineup-node.sh                      # key=value arguments go to captionrl train
#   scripts/launch/lineup-node.sh --dry-run            # print every command and the plan, start nothing
#
# Overrides: VERIFIER_GPUS (0,1), GLM_GPUS (2), PHI_GPUS (3), TRAIN_GPUS (4,5,6,7), <NAME>_MODEL, <NAME>_ARGS,
# CONFIG; the rest (CAPTIONRL_GPU_MEMORY, ...) in scripts/launch/common.sh.
source "$(dirname "$0")/common.sh"
launch_init "LineupRL, one 8-GPU node" "$@"
CONFIG=${CONFIG:-configs/lineup-paper.yaml}
VERIFIER_GPUS=${VERIFIER_GPUS:-0,1}
TRAIN_GPUS=${TRAIN_GPUS:-4,5,6,7}
VERIFIER_LEN=16384  # K=4 series as numbers + a 1,024-token caption; Phi-4's whole context
LAUNCH="accelerate configs/accelerate/multi-gpu-zero2.yaml $(gpu_count "$TRAIN_GPUS")"
plan_memory "$LAUNCH" "$CONFIG" --
serve verifier verifier "$VERIFIER_GPUS" Qwen/Qwen2.5-14B-Instruct --data-parallel-size "$(gpu_count "$VERIFIER_GPUS")" \
  --max-model-len "$VERIFIER_LEN"
serve glm eval.verifiers.GLM-4-9B 2 THUDM/glm-4-9b-chat-hf --max-model-len "$VERIFIER_LEN"  # loads natively: no remote code
serve phi eval.verifiers.Phi-4-14B 3 microsoft/phi-4 --max-model-len "$VERIFIER_LEN"        # Phi-4's own context
start_servers lineup "$CONFIG"
run_captionrl "$TRAIN_GPUS" "$LAUNCH" train lineup --config "$CONFIG"
stop_servers

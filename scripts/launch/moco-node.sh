#!/usr/bin/env bash
# MoCo Rubric (configs/moco-paper.yaml) on one 8-GPU node: no servers (the momentum adapter is the Generator
# and the Judge); GPUs 0-7 train LoRA under DeepSpeed ZeRO-2 with vLLM rollouts colocated.
#
#   scripts/launch/moco-node.sh policy.model=runs/moco-sft/model    # the shared SFT checkpoint (train moco-sft)
#   scripts/launch/moco-node.sh --dry-run
#
# Overrides: TRAIN_GPUS (0-7), CONFIG; the rest in scripts/launch/common.sh.
source "$(dirname "$0")/common.sh"
launch_init "MoCo Rubric, one 8-GPU node" "$@"
CONFIG=${CONFIG:-configs/moco-paper.yaml}
TRAIN_GPUS=${TRAIN_GPUS:-0,1,2,3,4,5,6,7}
moco_policy_note
run_captionrl "$TRAIN_GPUS" "accelerate configs/accelerate/multi-gpu-zero2.yaml $(gpu_count "$TRAIN_GPUS")" \
  train moco --config "$CONFIG"

#!/usr/bin/env bash
# MoCo Rubric (configs/moco-paper.yaml) on one GPU: LoRA (policy.lora=true: the momentum is a second adapter;
# float32 adapters, no DeepSpeed needed) with vLLM rollouts colocated (train.vllm_mode=colocate, the preset's
# 0.3 share), in one process; no servers (the momentum adapter is the Generator and the Judge). Not the
# paper's full-parameter run (moco-node.sh). Before anything starts, `captionrl plan` plans it (docs/gpu.md,
# "Memory plan": 83.2 of 141 GiB on an H200, 64.9 of 80 on an H100) and a plan that does not fit stops it.
#
#   scripts/launch/moco-1gpu.sh policy.model=runs/moco-sft/model   # the shared SFT checkpoint (train moco-sft)
#   scripts/launch/moco-1gpu.sh --dry-run
#
# Overrides: GPU (0), CONFIG; the rest (CAPTIONRL_GPU_MEMORY, ...) in scripts/launch/common.sh.
source "$(dirname "$0")/common.sh"
launch_init "MoCo Rubric, one GPU (LoRA, vLLM colocated)" "$@"
CONFIG=${CONFIG:-configs/moco-paper.yaml}
TRAIN_ARGS=(policy.lora=true train.vllm_mode=colocate)
moco_policy_note
plan_memory python "$CONFIG" -- "${TRAIN_ARGS[@]}"
start_servers moco "$CONFIG" "${TRAIN_ARGS[@]}"  # none: checks that the run needs none
run_captionrl "${GPU:-0}" python train moco --config "$CONFIG" "${TRAIN_ARGS[@]}"

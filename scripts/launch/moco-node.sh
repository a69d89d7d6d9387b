#!/usr/bin/env bash
# MoCo Rubric (configs/moco-paper.yaml) on one 8-GPU node of 141 GB cards (H200: the full-parameter plan needs
# 123.5 GiB per training GPU; on 80 GB cards use moco-1gpu.sh's LoRA layout), as the preset says: full-parameter training with
# the rollouts served from a GPU of their own (train.vllm_mode: server). GPU 0 runs TRL's vLLM server
# (`trl vllm-serve --model <policy.model> --port 8010 --max_model_len 18432`, every value read from the
# config), the script waits until it passes the checks TRL's client makes, then GPUs 1-7 train under DeepSpeed
# ZeRO-2 (the momentum is a full copy; the Generator and the Judge run on it in the training processes); the
# server is stopped when the script ends, however it ends. Before anything starts, `captionrl plan` plans the 7
# training GPUs (docs/gpu.md, "Memory plan": 123.5 of 141 GiB) and a plan that does not fit stops the launch.
#
#   scripts/launch/moco-node.sh policy.model=runs/moco-sft/model    # the shared SFT checkpoint (train moco-sft)
#   scripts/launch/moco-node.sh --dry-run
#
# Overrides: ROLLOUT_GPUS (0: TRL's vLLM server, tensor-parallel over its GPUs), ROLLOUT_ARGS (trl vllm-serve
# flags), TRAIN_GPUS (1-7), CONFIG; the rest (CAPTIONRL_GPU_MEMORY, CAPTIONRL_TRL_SERVE_CMD, ...) in
# scripts/launch/common.sh.
source "$(dirname "$0")/common.sh"
launch_init "MoCo Rubric, one 8-GPU node (full-parameter, TRL's vLLM server)" "$@"
CONFIG=${CONFIG:-configs/moco-paper.yaml}
TRAIN_GPUS=${TRAIN_GPUS:-1,2,3,4,5,6,7}
LAUNCH="accelerate configs/accelerate/multi-gpu-zero2.yaml $(gpu_count "$TRAIN_GPUS")"
moco_policy_note
plan_memory "$LAUNCH" "$CONFIG" --
serve_trl rollout 0
start_servers moco "$CONFIG"
run_captionrl "$TRAIN_GPUS" "$LAUNCH" train moco --config "$CONFIG"
stop_servers

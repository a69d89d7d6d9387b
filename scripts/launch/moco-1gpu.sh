#!/usr/bin/env bash
# MoCo Rubric (configs/moco-paper.yaml) on one GPU: no servers (the momentum adapter is the Generator and the
# Judge), LoRA (float32 adapters: no DeepSpeed needed), vLLM rollouts colocated.
#
#   scripts/launch/moco-1gpu.sh policy.model=runs/moco-sft/model   # the shared SFT checkpoint (train moco-sft)
#   scripts/launch/moco-1gpu.sh --dry-run
#
# Overrides: GPU (0), CONFIG; the rest in scripts/launch/common.sh.
source "$(dirname "$0")/common.sh"
launch_init "MoCo Rubric, one GPU" "$@"
CONFIG=${CONFIG:-configs/moco-paper.yaml}
moco_policy_note
run_captionrl "${GPU:-0}" python train moco --config "$CONFIG"

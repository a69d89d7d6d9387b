#!/usr/bin/env bash
# RubiCap (configs/rubicap-paper.yaml) on one GPU (80-141 GB). Not the paper's scale, and says where:
#  1. the rubric store, unless RUBRIC_STORE names one (built on a node: rubicap-node.sh): the open teachers
#     (a 72B VL model among them) do not fit one GPU, so the committee is the preset's API teachers only
#     (GEMINI_API_KEY, OPENAI_API_KEY) with the API writer, and the GPU serves the student Qwen2.5-VL-7B;
#  2. training: the GPU serves a Qwen2.5-7B judge (the preset's 72B does not fit beside a 7B policy) and trains
#     LoRA adapters (GRPO, vLLM rollouts colocated) on the store.
#
#   RUBRIC_STORE=path/rubrics.jsonl scripts/launch/rubicap-1gpu.sh   # train on a store built elsewhere
#   scripts/launch/rubicap-1gpu.sh                     # build the store with the API committee, then train
#   scripts/launch/rubicap-1gpu.sh --dry-run
#
# Overrides: GPU (0), RUBRIC_STORE, STUDENT_MODEL, JUDGE_MODEL (Qwen/Qwen2.5-7B-Instruct) and JUDGE_NAME
# (its served name, Qwen2.5-7B-Instruct), JUDGE_MEMORY (0.25), TRAIN_VLLM_MEMORY (0.2), CONFIG; the rest in
# scripts/launch/common.sh.
source "$(dirname "$0")/common.sh"
launch_init "RubiCap, one GPU (LoRA, a 7B judge, the API committee: not the paper's scale)" "$@"
CONFIG=${CONFIG:-configs/rubicap-paper.yaml}
GPU=${GPU:-0}
STORE=${RUBRIC_STORE:-}
if [ -z "$STORE" ]; then
  note "not the paper: the rubric committee is the config's API teachers only (its open teachers do not fit one GPU)"
  serve student rubrics.student "$GPU" Qwen/Qwen2.5-VL-7B-Instruct
  API_COMMITTEE=1 start_servers rubicap "$CONFIG" build_rubrics=true
  run_captionrl "" python train rubicap --config "$CONFIG" --build-rubrics "$PLAN_OVERRIDE"
  stop_servers
  STORE=$PLAN_STORE
fi
JUDGE_NAME=${JUDGE_NAME:-Qwen2.5-7B-Instruct}
serve judge judge "$GPU" Qwen/Qwen2.5-7B-Instruct --gpu-memory-utilization "${JUDGE_MEMORY:-0.25}"
start_servers rubicap "$CONFIG" rubrics.source=store "rubrics.store=$STORE" "judge.model=$JUDGE_NAME"
run_captionrl "$GPU" python train rubicap --config "$CONFIG" rubrics.source=store "rubrics.store=$STORE" \
  "judge.model=$JUDGE_NAME" policy.lora=true "train.vllm_gpu_memory_utilization=${TRAIN_VLLM_MEMORY:-0.2}"
stop_servers

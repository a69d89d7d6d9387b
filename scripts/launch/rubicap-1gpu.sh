#!/usr/bin/env bash
# RubiCap (configs/rubicap-paper.yaml) on one GPU, a 141 GB card (H200; the plan refuses an 80 GB card: the
# colocated engine's 0.2 share cannot hold the 7B policy beside its profiling peak). Not the paper's scale, and says where:
#  1. the rubric store, unless RUBRIC_STORE names one (built on a node: rubicap-node.sh): the open teachers
#     (a 72B VL model among them) do not fit one GPU, so the committee is the preset's API teachers only
#     (GEMINI_API_KEY, OPENAI_API_KEY) with the API writer, and the GPU serves the student Qwen2.5-VL-7B;
#  2. training: the GPU serves a Qwen2.5-7B judge at 0.25 of it (the preset's 72B does not fit beside a 7B
#     policy) and trains LoRA adapters in one process (GRPO, vLLM rollouts colocated at 0.2) on the store.
# Before anything starts, `captionrl plan` plans the training (docs/gpu.md, "Memory plan": 96.7 of 141 GiB)
# and every server before it starts, and a plan that does not fit stops the launch.
#
#   RUBRIC_STORE=path/rubrics.jsonl scripts/launch/rubicap-1gpu.sh   # train on a store built elsewhere
#   scripts/launch/rubicap-1gpu.sh                     # build the store with the API committee, then train
#   scripts/launch/rubicap-1gpu.sh --dry-run
#
# Overrides: GPU (0), RUBRIC_STORE, STUDENT_MODEL, JUDGE_MODEL (Qwen/Qwen2.5-7B-Instruct) and JUDGE_NAME
# (its served name, Qwen2.5-7B-Instruct), JUDGE_MEMORY (0.25), TRAIN_VLLM_MEMORY (0.2), CONFIG; the rest in
# scripts/launch/common.sh (CAPTIONRL_GPU_MEMORY, ...). The plan reads the shares.
source "$(dirname "$0")/common.sh"
launch_init "RubiCap, one GPU (LoRA, a 7B judge, the API committee: not the paper's scale)" "$@"
CONFIG=${CONFIG:-configs/rubicap-paper.yaml}
GPU=${GPU:-0}
STORE=${RUBRIC_STORE:-}
JUDGE=Qwen/Qwen2.5-7B-Instruct
JUDGE_NAME=${JUDGE_NAME:-Qwen2.5-7B-Instruct}
JUDGE_MEMORY=${JUDGE_MEMORY:-0.25}
CAPTION_LEN=18432  # one image of up to 16,384 tokens + the instruction + a 1,024-token caption (the preset's)
JUDGE_LEN=8192     # the rubric, one caption of up to 1,024 tokens and the judge's reply: text only
TRAIN_ARGS=("judge.model=$JUDGE_NAME" policy.lora=true "train.vllm_gpu_memory_utilization=${TRAIN_VLLM_MEMORY:-0.2}")
PLAN_ARGS=()  # the store is built below when none is given: the plan needs only the training's settings
[ -n "$STORE" ] && PLAN_ARGS=(rubrics.source=store "rubrics.store=$STORE")
plan_memory python "$CONFIG" --served "$(model_of judge "$JUDGE")@$JUDGE_MEMORY" -- "${PLAN_ARGS[@]}" "${TRAIN_ARGS[@]}"
if [ -z "$STORE" ]; then
  note "not the paper: the rubric committee is the config's API teachers only (its open teachers do not fit one GPU)"
  serve student rubrics.student "$GPU" Qwen/Qwen2.5-VL-7B-Instruct --max-model-len "$CAPTION_LEN"
  API_COMMITTEE=1 start_servers rubicap "$CONFIG" build_rubrics=true
  run_captionrl "" python train rubicap --config "$CONFIG" --build-rubrics "$PLAN_OVERRIDE"
  stop_servers
  STORE=$PLAN_STORE
fi
serve judge judge "$GPU" "$JUDGE" --gpu-memory-utilization "$JUDGE_MEMORY" --max-model-len "$JUDGE_LEN"
start_servers rubicap "$CONFIG" rubrics.source=store "rubrics.store=$STORE" "${TRAIN_ARGS[@]}"
run_captionrl "$GPU" python train rubicap --config "$CONFIG" rubrics.source=store "rubrics.store=$STORE" "${TRAIN_ARGS[@]}"
stop_servers

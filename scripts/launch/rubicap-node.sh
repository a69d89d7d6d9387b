#!/usr/bin/env bash
# RubiCap (configs/rubicap-paper.yaml) on one 8-GPU node, in two phases that use the GPUs in turn:
#  1. the rubric store: GPUs 0-3 serve Qwen2.5-VL-72B (tensor parallel 4), GPU 4 gemma-3-27b, GPU 5
#     Qwen3-VL-30B-A3B (the open teachers of the committee), GPU 6 the student Qwen2.5-VL-7B; the proprietary
#     teachers and the writer are APIs (GEMINI_API_KEY, OPENAI_API_KEY); `train rubicap --build-rubrics` in one
#     process (resumable), then these servers stop;
#  2. training: GPUs 0-3 serve the Qwen2.5-72B judge (tensor parallel 4), GPUs 4-7 train (GRPO, DeepSpeed
#     ZeRO-3, vLLM rollouts colocated at the preset's 0.3) on the store (rubrics.source=store: no committee
#     server is needed).
# Before anything starts, `captionrl plan` plans phase 2's 4 training GPUs (docs/gpu.md, "Memory plan") and a
# plan that does not fit stops the launch.
#
#   scripts/launch/rubicap-node.sh                     # key=value arguments go to both captionrl commands
#   RUBRIC_STORE=runs/rubicap-paper/rubrics/rubrics.jsonl scripts/launch/rubicap-node.sh   # skip phase 1
#   scripts/launch/rubicap-node.sh --dry-run
#
# Overrides: RUBRIC_STORE, TRAIN_GPUS (4,5,6,7), <NAME>_MODEL / _GPUS / _ARGS for qwen72, gemma, qwen3, student,
# judge; CONFIG; the rest (CAPTIONRL_GPU_MEMORY, ...) in scripts/launch/common.sh.
source "$(dirname "$0")/common.sh"
launch_init "RubiCap, one 8-GPU node" "$@"
CONFIG=${CONFIG:-configs/rubicap-paper.yaml}
TRAIN_GPUS=${TRAIN_GPUS:-4,5,6,7}
STORE=${RUBRIC_STORE:-}
CAPTION_LEN=18432  # the teachers' and the student's context: one image of up to 16,384 tokens + instruction + caption
LAUNCH="accelerate configs/accelerate/multi-gpu-zero3.yaml $(gpu_count "$TRAIN_GPUS")"
PLAN_ARGS=()  # the store is built below when none is given: the plan needs only the training's settings
[ -n "$STORE" ] && PLAN_ARGS=(rubrics.source=store "rubrics.store=$STORE")
plan_memory "$LAUNCH" "$CONFIG" -- "${PLAN_ARGS[@]}"
if [ -z "$STORE" ]; then
  serve qwen72 "rubrics.committee[2]" 0,1,2,3 Qwen/Qwen2.5-VL-72B-Instruct --tensor-parallel-size 4 --max-model-len "$CAPTION_LEN"
  serve gemma "rubrics.committee[3]" 4 google/gemma-3-27b-it --max-model-len "$CAPTION_LEN"
  serve qwen3 "rubrics.committee[4]" 5 Qwen/Qwen3-VL-30B-A3B-Instruct --max-model-len "$CAPTION_LEN"
  serve student rubrics.student 6 Qwen/Qwen2.5-VL-7B-Instruct --max-model-len "$CAPTION_LEN"
  start_servers rubicap "$CONFIG" build_rubrics=true
  run_captionrl "" python train rubicap --config "$CONFIG" --build-rubrics
  stop_servers
  STORE=$PLAN_STORE
fi
JUDGE_GPUS=${JUDGE_GPUS:-0,1,2,3}
serve judge judge "$JUDGE_GPUS" Qwen/Qwen2.5-72B-Instruct --tensor-parallel-size "$(gpu_count "$JUDGE_GPUS")" --max-model-len 8192
start_servers rubicap "$CONFIG" rubrics.source=store "rubrics.store=$STORE"
run_captionrl "$TRAIN_GPUS" "$LAUNCH" train rubicap --config "$CONFIG" rubrics.source=store "rubrics.store=$STORE"
stop_servers

# shellcheck shell=bash
# Shared by scripts/launch/*.sh (sourced, never run): plan the training's GPU memory (`captionrl plan`) and
# refuse a launch that does not fit, start the servers a run's config names, wait until each answers, train,
# and stop every process this script started when it ends: normally, on a failure, on Ctrl-C or on SIGTERM.
# `--dry-run` prints every command (the plan's too, and its table) and starts nothing.
#
# A launch script, top to bottom:
#   source "$(dirname "$0")/common.sh"
#   launch_init "LineupRL, one GPU" "$@"          # --dry-run, --help; every key=value goes to the run
#   LAUNCH="accelerate configs/accelerate/multi-gpu-zero2.yaml 1"
#   plan_memory "$LAUNCH" configs/lineup-paper.yaml --served Qwen/Qwen2.5-14B-Instruct@0.3 -- eval.enabled=false
#   serve verifier verifier 0 Qwen/Qwen2.5-14B-Instruct --gpu-memory-utilization 0.3
#   start_servers lineup configs/lineup-paper.yaml eval.enabled=false   # checks against the config, plans, starts, waits
#   run_captionrl 0 "$LAUNCH" train lineup --config configs/lineup-paper.yaml eval.enabled=false
#   stop_servers
#
# `plan_memory LAUNCHER CONFIG [captionrl plan flags] -- OVERRIDES` runs `captionrl plan` for the training the
# script launches: LAUNCHER as run_captionrl's (its accelerate config and process count become --accelerate and
# --gpus; "python" is --accelerate none --gpus 1), the card's memory (--gpu-memory, below), the script's
# overrides and every key=value given to the script (--set), and engines served on the training GPUs
# (--served MODEL@SHARE, given by the script). A plan that does not fit stops the script (status 2) before
# anything starts; `train.memory_plan=warn` given to the script goes on with a warning, `=off` skips the plan
# (the training's own check on CUDA follows the same setting).
#
# `start_servers` plans every server of its phase first (`captionrl plan --server NAME|MODEL|GPUS|FLAGS`: weights,
# vLLM's own memory and one sequence of KV cache at its --max-model-len inside its share of the card; plan_servers)
# and refuses a phase whose plan does not fit before any of its servers starts, as plan_memory does.
#
# `serve NAME FIELD GPUS MODEL [vLLM flags]` registers one server: NAME is the script's short name, FIELD the
# config field whose server it is (its port and served model name are read from the config, never typed
# twice). NAME also names its overrides: <NAME>_MODEL (the weights), <NAME>_GPUS, <NAME>_ARGS (extra vLLM
# flags), e.g. VERIFIER_MODEL, GLM_GPUS, JUDGE_ARGS ("-" in NAME is "_").
# `serve_trl NAME GPUS [trl vllm-serve flags]` registers TRL's vLLM server for a run in train.vllm_mode=server:
# `trl vllm-serve --model <policy.model> --host H --port P --max_model_len N --tensor_parallel_size <GPUs>`,
# every value read from the config (train.vllm_server_host/_port, train.vllm_max_model_length, policy.model);
# it is ready when it passes the checks TRL's client makes (GET /health, /v1/models, /server_info).
# Overrides <NAME>_GPUS, <NAME>_ARGS.
#
# Environment (all optional):
#   CAPTIONRL_GPU_MEMORY     GiB of one GPU for the memory plan (default: the smallest memory.total nvidia-smi
#                            lists, else 141, an H200; 80 plans an H100)
#   CAPTIONRL_SERVE_CMD      the server command (default: vllm serve); it gets MODEL --served-model-name NAME
#                            --host HOST --port PORT and the vLLM flags. The CPU test uses
#                            "python -m captionrl.testing.vllm_standin" (llama.cpp behind vLLM's command line).
#   CAPTIONRL_TRL_SERVE_CMD  TRL's server command (default: trl vllm-serve); the CPU test uses
#                            "python -m captionrl.testing.trl_standin"
#   CAPTIONRL_SERVE_MODEL    serve this model in every `serve` server instead of the scripts' hub ids (the served
#                            names stay the config's; the memory plan still plans the scripts' models)
#   CAPTIONRL_PYTHON         the Python that runs captionrl and accelerate (default: .venv-gpu/bin/python, the GPU
#                            environment of scripts/setup.sh --gpu, refused while that setup has not finished; else
#                            .venv/bin/python, the CPU install, with a warning; else python3). Its bin folder goes
#                            first on PATH when it holds vllm or trl, so the servers come from the same environment.
#   CAPTIONRL_ACCELERATE_CONFIG, CAPTIONRL_NUM_PROCESSES, CAPTIONRL_MAIN_PROCESS_PORT
#                            replace the script's accelerate config file and process count; the rendezvous port
#   CAPTIONRL_READY_TIMEOUT  seconds the servers of one phase get to answer, together (default 1800: a 72B
#                            model over tensor parallelism loads in minutes from a local disk; a first download
#                            takes longer: download first with `huggingface-cli download`)
#   CAPTIONRL_LAUNCH_LOGS    folder of the server logs (default runs/launch/<script>-<date>-<time>)
#   CAPTIONRL_STOP_GRACE     seconds a process group gets after SIGTERM before SIGKILL (default 30)

set -euo pipefail

LAUNCH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LAUNCH_NAME="$(basename "$0" .sh)"
DRY_RUN=0
RUN_ARGS=()        # key=value overrides given to the script: passed to every captionrl command it runs
SERVER_NAMES=() SERVER_FIELDS=() SERVER_GPUS=() SERVER_MODELS=() SERVER_FLAGS=() SERVER_KINDS=() SERVER_PLAN_MODELS=()
STARTED_PIDS=() STARTED_NAMES=()
TRAIN_PID=""
# every process of the training carries this in its environment: torch's elastic launcher starts each worker in a
# session of its own, out of reach of the training's process group, so the stop finds the workers by it
TRAIN_TAG="CAPTIONRL_LAUNCH=$$-$RANDOM$RANDOM"

launch_help() {
  # The header comment of the launch script itself (its lines after the shebang, up to the first blank one).
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  cat <<'EOF'

Options: --dry-run (print every command, start nothing), --help. Every key=value argument goes to the
captionrl command(s) the script runs (e.g. train.max_steps=10). Environment overrides: see
scripts/launch/common.sh (CAPTIONRL_SERVE_CMD, <NAME>_MODEL, <NAME>_GPUS, <NAME>_ARGS, ...).
EOF
}

say() { echo "launch: $*" >&2; }

die() {  # die PROBLEM FIX
  say "$1. Fix: $2"
  exit 2
}

launch_init() {  # launch_init TITLE "$@"
  local title=$1
  shift
  for a in "$@"; do
    case "$a" in
      --dry-run) DRY_RUN=1 ;;
      -h|--help) launch_help; exit 0 ;;
      *=*) RUN_ARGS+=("$a") ;;
      *) die "unknown argument '$a'" "give --dry-run, --help or key=value overrides (run $0 --help)" ;;
    esac
  done
  cd "$LAUNCH_ROOT"
  pick_python
  export PYTHONPATH="$LAUNCH_ROOT/src${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's captionrl
  local bin
  bin=$(cd "$(dirname "$PY")" && pwd)
  # the servers (vllm, trl) come from the training's environment when it has them, as if it were activated
  if [ -x "$bin/vllm" ] || [ -x "$bin/trl" ]; then export PATH="$bin:$PATH"; fi
  read -r -a SERVE_CMD <<< "${CAPTIONRL_SERVE_CMD:-vllm serve}"
  read -r -a TRL_SERVE_CMD <<< "${CAPTIONRL_TRL_SERVE_CMD:-trl vllm-serve}"
  READY_TIMEOUT=${CAPTIONRL_READY_TIMEOUT:-1800}
  STOP_GRACE=${CAPTIONRL_STOP_GRACE:-30}
  LOG_DIR=${CAPTIONRL_LAUNCH_LOGS:-runs/launch/$LAUNCH_NAME-$(date +%Y%m%d-%H%M%S)}
  if [ "$DRY_RUN" = 1 ]; then
    echo "# $title ($0): dry run, nothing is started"
  else
    command -v setsid > /dev/null || die "setsid (util-linux) is not installed" "install util-linux: the script stops each server's whole process group with it"
    if [ "${SERVE_CMD[0]}" = vllm ] && ! command -v vllm > /dev/null; then
      die "vllm is not on PATH" "install the gpu extra (scripts/setup.sh --gpu) and activate its environment, or set CAPTIONRL_SERVE_CMD"
    fi
    mkdir -p "$LOG_DIR"
    trap cleanup EXIT
    trap 'say "interrupted: stopping training and servers"; exit 130' INT
    trap 'say "terminated: stopping training and servers"; exit 143' TERM
    trap 'exit 129' HUP  # the terminal closed: still stop everything
    trap '' PIPE         # a closed output pipe fails a write (and set -e exits through cleanup) instead of killing bash
    say "$title; logs in $LOG_DIR"
  fi
  [ -z "$PY_WARNING" ] || note "$PY_WARNING"
}

pick_python() {  # PY: CAPTIONRL_PYTHON, else the GPU environment (.venv-gpu), else .venv, else python3
  PY=${CAPTIONRL_PYTHON:-}
  PY_WARNING=""
  [ -n "$PY" ] && return 0
  if [ -x .venv-gpu/bin/python ]; then
    # scripts/setup.sh --gpu writes the marker only once its checks pass: a half-built environment is refused
    [ -f .venv-gpu/captionrl-gpu-ready ] \
      || die ".venv-gpu exists but scripts/setup.sh --gpu did not finish (no .venv-gpu/captionrl-gpu-ready)" \
             "rerun bash scripts/setup.sh --gpu (it says what failed), or set CAPTIONRL_PYTHON to the Python to use"
    PY=.venv-gpu/bin/python
  elif [ -x .venv/bin/python ]; then
    PY=.venv/bin/python
    PY_WARNING="WARNING: no GPU environment (.venv-gpu): training runs with .venv, the CPU install without vLLM; build it with bash scripts/setup.sh --gpu, or set CAPTIONRL_PYTHON"
  else
    PY=python3
  fi
}

note() {  # a remark: a comment line in a dry run, a message otherwise
  if [ "$DRY_RUN" = 1 ]; then echo "# $*"; else say "$*"; fi
}

moco_policy_note() {  # MoCo starts from the shared SFT checkpoint; say so when none is given
  local a
  for a in "${RUN_ARGS[@]}"; do [[ "$a" == policy.model=* ]] && return 0; done
  note "policy.model is the preset's hub model; the paper starts from the shared multi-role SFT checkpoint (captionrl train moco-sft): pass policy.model=runs/moco-sft/model"
}

upper() { local s=${1//-/_}; echo "${s^^}"; }

model_of() {  # model_of NAME DEFAULT: the weights `serve NAME ...` loads (<NAME>_MODEL or DEFAULT), for the plan
  local var
  var="$(upper "$1")_MODEL"
  echo "${!var:-$2}"
}

serve() {  # serve NAME FIELD GPUS MODEL [vLLM flags...]
  local name=$1 field=$2 gpus=$3 model=$4
  shift 4
  local key
  key=$(upper "$name")
  local gpus_var="${key}_GPUS" args_var="${key}_ARGS"
  SERVER_NAMES+=("$name")
  SERVER_FIELDS+=("$field")
  SERVER_KINDS+=(openai)
  SERVER_GPUS+=("${!gpus_var:-$gpus}")
  SERVER_MODELS+=("${CAPTIONRL_SERVE_MODEL:-$(model_of "$name" "$model")}")
  SERVER_PLAN_MODELS+=("$(model_of "$name" "$model")")
  SERVER_FLAGS+=("$* ${!args_var:-}")
}

serve_trl() {  # serve_trl NAME GPUS [trl vllm-serve flags...]: TRL's vLLM server (train.vllm_mode=server)
  local name=$1 gpus=$2
  shift 2
  local key
  key=$(upper "$name")
  local gpus_var="${key}_GPUS" args_var="${key}_ARGS"
  SERVER_NAMES+=("$name")
  SERVER_FIELDS+=(train.vllm_server)
  SERVER_KINDS+=(trl)
  SERVER_GPUS+=("${!gpus_var:-$gpus}")
  SERVER_MODELS+=("")  # policy.model, read from the config by the plan
  SERVER_PLAN_MODELS+=("")
  SERVER_FLAGS+=("$* ${!args_var:-}")
}

gpu_count() { local IFS=,; local a; read -r -a a <<< "$1"; echo "${#a[@]}"; }

gpu_memory() {  # GiB of one GPU for the plan: CAPTIONRL_GPU_MEMORY, else the smallest card nvidia-smi lists, else 141
  if [ -n "${CAPTIONRL_GPU_MEMORY:-}" ]; then
    echo "$CAPTIONRL_GPU_MEMORY CAPTIONRL_GPU_MEMORY"
    return 0
  fi
  local mib=""
  if command -v nvidia-smi > /dev/null; then
    mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2> /dev/null | sort -n | head -n 1 | tr -d ' ') || mib=""
  fi
  if [[ "$mib" =~ ^[0-9]+$ ]] && [ "$mib" -gt 0 ]; then
    echo "$(awk -v m="$mib" 'BEGIN { printf "%.1f", int(m / 1024 * 10) / 10 }') nvidia-smi"
  else
    echo "141 default"
  fi
}

memory_plan_mode() {  # train.memory_plan as given to the script (the last one wins), else refuse
  local a mode=refuse
  for a in "${RUN_ARGS[@]}"; do [[ "$a" == train.memory_plan=* ]] && mode=${a#train.memory_plan=}; done
  echo "$mode"
}

# plan_memory LAUNCHER CONFIG [captionrl plan flags...] -- OVERRIDES...: the GPU memory plan of the training this
# script launches (see the header); refuses the launch when it does not fit
plan_memory() {
  local launcher=$1 config=$2
  shift 2
  local flags=()
  while [ "$#" -gt 0 ] && [ "$1" != -- ]; do flags+=("$1"); shift; done
  [ "$#" -gt 0 ] && shift
  local how mem source mode
  read -r -a how <<< "$launcher"
  read -r mem source <<< "$(gpu_memory)"
  mode=$(memory_plan_mode)
  local cmd=("$PY" -m captionrl.cli plan --config "$config")
  if [ "${how[0]}" = accelerate ]; then
    cmd+=(--accelerate "${CAPTIONRL_ACCELERATE_CONFIG:-${how[1]}}" --gpus "${CAPTIONRL_NUM_PROCESSES:-${how[2]}}")
  else
    cmd+=(--accelerate none --gpus 1)
  fi
  cmd+=(--gpu-memory "$mem")
  local o
  for o in "$@" "${RUN_ARGS[@]}"; do cmd+=(--set "$o"); done
  cmd+=("${flags[@]}")
  if [ "$mode" = off ]; then
    note "memory plan skipped (train.memory_plan=off): $(show "${cmd[@]}")"
    return 0
  fi
  [ "$source" = default ] && note "GPU memory for the plan: 141 GiB (an H200: no nvidia-smi answered here; CAPTIONRL_GPU_MEMORY=80 plans an H100)"
  run_plan "memory plan" "$mode" "nothing was started" \
    "follow the plan's fix (a smaller vLLM share: <NAME>_MEMORY, TRAIN_VLLM_MEMORY; more GPUs; LoRA), check CAPTIONRL_GPU_MEMORY ($mem GiB), or give train.memory_plan=warn to launch anyway" \
    "${cmd[@]}"
}

# run_plan WHAT MODE STOPPED FIX CMD...: run a `captionrl plan` command, print it and its table (as comments in a
# dry run), and stop the script with STOPPED and FIX when the plan refuses (MODE warn: say so and go on).
run_plan() {
  local what=$1 mode=$2 stopped=$3 fix=$4 out rc=0
  shift 4
  if [ "$DRY_RUN" = 1 ]; then show "$@"; else say "$what: $(show "$@")"; fi
  out=$("$@" 2>&1) || rc=$?
  if [ "$DRY_RUN" = 1 ]; then sed 's/^/# /' <<< "$out"; else echo "$out" >&2; fi
  [ "$rc" = 0 ] && return 0
  if [ "$mode" = warn ]; then
    note "WARNING: the $what refuses (above); going on (train.memory_plan=warn)"
    return 0
  fi
  die "the $what refuses this launch (above): $stopped" "$fix"
}

show() {  # print a command as one copy-pasteable line (words with shell characters in single quotes)
  local out=() w q="'"
  for w in "$@"; do
    if [[ "$w" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then out+=("$w"); else out+=("$q${w//$q/$q\\$q$q}$q"); fi
  done
  echo "${out[*]}"
}

# plan_servers PLAN: `captionrl plan --server ...` for every server of this phase (its weights, vLLM's own memory and
# one sequence of KV cache at its --max-model-len, inside its --gpu-memory-utilization share of the card), before any
# starts; a server that does not fit stops the script (train.memory_plan=warn goes on, =off skips), as plan_memory.
plan_servers() {
  [ "${#SERVER_NAMES[@]}" -gt 0 ] || return 0
  local mem source mode i cmd=()
  read -r mem source <<< "$(gpu_memory)"
  mode=$(memory_plan_mode)
  cmd=("$PY" -m captionrl.cli plan --gpu-memory "$mem")
  for i in "${!SERVER_NAMES[@]}"; do
    local model=${SERVER_PLAN_MODELS[$i]} flags=${SERVER_FLAGS[$i]}
    if [ "${SERVER_KINDS[$i]}" = trl ]; then  # trl vllm-serve: the policy, the config's max_model_len, TP over its GPUs
      local line max_len
      line=$(awk -v f="${SERVER_FIELDS[$i]}" '$1 == "trl" && $2 == f' <<< "$1")
      read -r _ _ _ _ max_len model <<< "$line"
      flags="--tensor-parallel-size $(gpu_count "${SERVER_GPUS[$i]}") $flags"
      [ "$max_len" != - ] && flags="--max-model-len $max_len $flags"
    fi
    local words
    read -r -a words <<< "$flags"
    cmd+=(--server "${SERVER_NAMES[$i]}|$model|${SERVER_GPUS[$i]}|${words[*]}")
  done
  if [ "$mode" = off ]; then
    note "server memory plan skipped (train.memory_plan=off): $(show "${cmd[@]}")"
    return 0
  fi
  run_plan "server memory plan" "$mode" "no server of this phase was started" \
    "follow the plan's fix (--max-model-len, <NAME>_ARGS, <NAME>_GPUS), check CAPTIONRL_GPU_MEMORY ($mem GiB), or give train.memory_plan=warn to launch anyway" \
    "${cmd[@]}"
}

start_servers() {  # start_servers RECIPE CONFIG [overrides...]: check the servers against the config, start, wait
  local recipe=$1 config=$2
  shift 2
  local plan_args=(plan "$recipe" "$config")
  local f
  for f in "${SERVER_FIELDS[@]}"; do plan_args+=(--serve "$f"); done
  [ "$DRY_RUN" = 1 ] && plan_args+=(--dry-run)
  [ "${API_COMMITTEE:-0}" = 1 ] && plan_args+=(--api-committee)
  local plan
  plan=$("$PY" scripts/launch/servers.py "${plan_args[@]}" -- "$@" "${RUN_ARGS[@]}") || exit 2
  PLAN_STORE=$(awk '$1 == "store" { print $2 }' <<< "$plan")
  PLAN_OVERRIDE=$(sed -n 's/^override //p' <<< "$plan")
  grep '^# WARNING' <<< "$plan" || true
  plan_servers "$plan"
  local waits=() i
  for i in "${!SERVER_FIELDS[@]}"; do
    local name=${SERVER_NAMES[$i]} field=${SERVER_FIELDS[$i]} kind=${SERVER_KINDS[$i]} line host port served cmd
    local flags
    read -r -a flags <<< "${SERVER_FLAGS[$i]}"
    if [ "$kind" = trl ]; then
      local max_len probe
      line=$(awk -v f="$field" '$1 == "trl" && $2 == f' <<< "$plan")
      read -r _ _ host port max_len served <<< "$line"
      [ "$DRY_RUN" = 1 ] || command -v "${TRL_SERVE_CMD[0]}" > /dev/null \
        || die "${TRL_SERVE_CMD[0]} is not on PATH" "install the gpu extra (scripts/setup.sh --gpu: TRL and vLLM) and activate its environment, or set CAPTIONRL_TRL_SERVE_CMD"
      cmd=(env "CUDA_VISIBLE_DEVICES=${SERVER_GPUS[$i]}" "${TRL_SERVE_CMD[@]}" --model "$served" --host "$host" --port "$port")
      [ "$max_len" != - ] && cmd+=(--max_model_len "$max_len")
      cmd+=(--tensor_parallel_size "$(gpu_count "${SERVER_GPUS[$i]}")" "${flags[@]}")
      probe=$host
      case "$host" in 0.0.0.0|::|"") probe=127.0.0.1 ;; esac  # a wildcard bind answers on loopback
      waits+=("trl=$field=http://$probe:$port=$served")
    else
      line=$(awk -v f="$field" '$1 == "serve" && $2 == f' <<< "$plan")
      read -r _ _ host port served <<< "$line"
      cmd=(env "CUDA_VISIBLE_DEVICES=${SERVER_GPUS[$i]}" "${SERVE_CMD[@]}" "${SERVER_MODELS[$i]}"
           --served-model-name "$served" --host "$host" --port "$port" "${flags[@]}")
      waits+=("openai=$field=http://$host:$port/v1=$served")
    fi
    local log="$LOG_DIR/$name.log"
    if [ "$DRY_RUN" = 1 ]; then
      echo "$(show "${cmd[@]}") > $(show "$log") 2>&1 &"
      continue
    fi
    local what=$served
    [ "$kind" = trl ] || what="${SERVER_MODELS[$i]} as $served"
    say "starting $name ($field: $what on $host:$port, GPUs ${SERVER_GPUS[$i]}); log $log"
    setsid "${cmd[@]}" > "$log" 2>&1 < /dev/null &
    STARTED_PIDS+=("$!")
    STARTED_NAMES+=("$name")
    waits[-1]+="=$!=$log"
  done
  if [ "$DRY_RUN" = 1 ]; then
    local w how="" url
    for w in "${waits[@]}"; do
      IFS== read -r kind field url served <<< "$w"
      if [ "$kind" = trl ]; then
        how+="; $field: GET $url/health answers 200, then /v1/models lists $served and /server_info answers (TRL's client's checks)"
      else
        how+="; $field: GET $url/models lists $served"
      fi
    done
    [ -n "$how" ] && echo "# wait until every server above answers (deadline ${READY_TIMEOUT} s together)${how}"
    return 0
  fi
  [ "${#waits[@]}" -gt 0 ] || return 0
  "$PY" scripts/launch/servers.py wait --timeout "$READY_TIMEOUT" "${waits[@]}" || die "a server did not come up" "read its log (above); CAPTIONRL_READY_TIMEOUT=$READY_TIMEOUT s is the deadline"
}

# run_captionrl GPUS LAUNCHER WORDS...: run `captionrl WORDS... <script's key=value>` on GPUS in a process group
# of its own, while watching the servers. LAUNCHER is "python" (one process) or "accelerate CONFIG NPROC".
run_captionrl() {
  local gpus=$1 launcher=$2
  shift 2
  local how
  read -r -a how <<< "$launcher"
  local cmd=(env "CUDA_VISIBLE_DEVICES=$gpus" "$PY")
  if [ "${how[0]}" = accelerate ]; then
    local acfg=${CAPTIONRL_ACCELERATE_CONFIG:-${how[1]}} nproc=${CAPTIONRL_NUM_PROCESSES:-${how[2]}}
    cmd+=(-m accelerate.commands.launch --config_file "$acfg" --num_processes "$nproc")
    [ -n "${CAPTIONRL_MAIN_PROCESS_PORT:-}" ] && cmd+=(--main_process_port "$CAPTIONRL_MAIN_PROCESS_PORT")
  fi
  cmd+=(-m captionrl.cli "$@" "${RUN_ARGS[@]}")
  if [ "$DRY_RUN" = 1 ]; then
    show "${cmd[@]}"
    return 0
  fi
  say "running: $(show "${cmd[@]}")"
  setsid env "$TRAIN_TAG" "${cmd[@]}" < /dev/null &
  TRAIN_PID=$!
  local i
  while kill -0 "$TRAIN_PID" 2> /dev/null; do
    for i in "${!STARTED_PIDS[@]}"; do
      if ! kill -0 "${STARTED_PIDS[$i]}" 2> /dev/null; then
        say "server ${STARTED_NAMES[$i]} stopped while captionrl was running; last lines of $LOG_DIR/${STARTED_NAMES[$i]}.log:"
        tail -n 30 "$LOG_DIR/${STARTED_NAMES[$i]}.log" >&2 || true
        stop_training
        exit 1
      fi
    done
    sleep 2 & wait $! || true
  done
  local rc=0
  wait "$TRAIN_PID" || rc=$?
  TRAIN_PID=""
  if [ "$rc" != 0 ]; then
    say "captionrl $1 $2 exited with status $rc; the servers' logs are in $LOG_DIR"
    exit "$rc"
  fi
}

stop_group() {  # stop_group PID NAME: SIGTERM to the process group PID leads, then SIGKILL after the grace
  local pid=$1 name=$2 t=0
  kill -0 -- "-$pid" 2> /dev/null || { wait "$pid" 2> /dev/null || true; return 0; }
  say "stopping $name (process group $pid)"
  kill -TERM -- "-$pid" 2> /dev/null || true
  while kill -0 -- "-$pid" 2> /dev/null && [ "$t" -lt $((STOP_GRACE * 10)) ]; do
    sleep 0.1
    t=$((t + 1))
  done
  if kill -0 -- "-$pid" 2> /dev/null; then
    say "$name did not stop within $STOP_GRACE s: SIGKILL"
    kill -KILL -- "-$pid" 2> /dev/null || true
  fi
  wait "$pid" 2> /dev/null || true
}

tagged_pids() {  # the processes whose environment holds TRAIN_TAG: the training and each worker, wherever they run
  grep -lszx -- "$TRAIN_TAG" /proc/[0-9]*/environ 2> /dev/null | cut -d/ -f3 || true
}

stop_training() {  # the training's process group, then any of its workers left in sessions of their own
  local t=0 left
  stop_group "$TRAIN_PID" captionrl
  TRAIN_PID=""
  left=$(tagged_pids)
  [ -z "$left" ] && return 0
  say "stopping captionrl workers outside its process group: $(echo $left)"
  kill -TERM $left 2> /dev/null || true
  while [ -n "$(tagged_pids)" ] && [ "$t" -lt $((STOP_GRACE * 10)) ]; do
    sleep 0.1
    t=$((t + 1))
  done
  left=$(tagged_pids)
  if [ -n "$left" ]; then
    say "captionrl workers did not stop within $STOP_GRACE s: SIGKILL"
    kill -KILL $left 2> /dev/null || true
  fi
}

stop_servers() {  # stop every server started so far (the next phase starts its own)
  if [ "$DRY_RUN" = 1 ]; then
    [ "${#SERVER_NAMES[@]}" -gt 0 ] && echo "# stop ${SERVER_NAMES[*]} (SIGTERM to each server's process group, SIGKILL after ${STOP_GRACE} s)"
  fi
  local i
  for i in "${!STARTED_PIDS[@]}"; do
    stop_group "${STARTED_PIDS[$i]}" "${STARTED_NAMES[$i]}"
  done
  STARTED_PIDS=() STARTED_NAMES=()
  SERVER_NAMES=() SERVER_FIELDS=() SERVER_GPUS=() SERVER_MODELS=() SERVER_FLAGS=() SERVER_KINDS=() SERVER_PLAN_MODELS=()
}

cleanup() {  # the EXIT trap: whatever happened, leave no process of ours behind
  local rc=$?
  trap - EXIT INT TERM HUP
  if [ -n "$TRAIN_PID" ]; then stop_training; fi
  stop_servers
  exit "$rc"
}

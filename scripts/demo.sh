#!/usr/bin/env bash
# `make demo`: the whole loop on one machine, with no GPU and no services. SQLite and Celery's
# filesystem broker under var/; SmolLM2-135M-Instruct (from a pip package, no download) served
# by vLLM on the CPU; the web server (dashboard + OpenAI-compatible gateway) and Celery workers;
# the judge pointed at the local model; then the demo agent works a few dozen support tasks
# through the gateway so traces, comments and customer feedback are there to start from.
#
#   scripts/demo.sh [--fast]     --fast: a tiny model (built and fitted here once, a few minutes on a
#                                CPU, to answer with a greeting and one judgement) instead of SmolLM2
#
# Ctrl-C (or SIGTERM) stops everything it started and exits 0: each child runs in its own
# process group (set -m), and the vLLM supervisor stops its server's group when told to stop.
#
# Environment: PRACTICUM_HOST/PRACTICUM_PORT (127.0.0.1:8000), PRACTICUM_INFERENCE_PORT (8001),
# PRACTICUM_DATA_DIR (var/), PRACTICUM_DEMO_EPISODES (36, --fast 12), PRACTICUM_DEMO_AGENT=0 to
# skip the agent run, PRACTICUM_DEMO_AGENT_CONCURRENCY (4: training-split conversations at
# once), PRACTICUM_JUDGE_* to use another judge.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
FAST=0
for arg in "$@"; do
  case "$arg" in
    --fast) FAST=1 ;;
    -h|--help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;;  # the header comment, whatever its length
    *) echo "unknown argument: $arg (use --fast)" >&2; exit 2 ;;
  esac
done
[ "${FAST_DEMO:-0}" = 1 ] && FAST=1

HOST=${PRACTICUM_HOST:-127.0.0.1}
PORT=${PRACTICUM_PORT:-8000}
export PRACTICUM_INFERENCE_PORT=${PRACTICUM_INFERENCE_PORT:-8001}
export PRACTICUM_INFERENCE_URL=${PRACTICUM_INFERENCE_URL:-http://127.0.0.1:$PRACTICUM_INFERENCE_PORT}
DATA_DIR=${PRACTICUM_DATA_DIR:-$PWD/var}
export PRACTICUM_DATA_DIR=$DATA_DIR
LOGS="$DATA_DIR/logs"
mkdir -p "$LOGS"
if [ "$FAST" = 1 ]; then
  KIND=tiny-talking; BASE=tiny-talking; EPISODES=${PRACTICUM_DEMO_EPISODES:-12}
else
  KIND=smollm2; BASE=smollm2-135m-instruct; EPISODES=${PRACTICUM_DEMO_EPISODES:-36}
fi
URL="http://$HOST:$PORT"

# The judge: our own vLLM, through structured output. A 135M model only proves the path (its
# rewards mean little); point PRACTICUM_JUDGE_* at a stronger model for real judgements.
# Tight bounds keep a small model from repeating itself up to max_tokens.
# Our own server's context is 2048 tokens (serve_inference's max_model_len): the conversation a
# judgement reads is trimmed to fit beside its answer, or the server refuses it with an HTTP 400.
if [ -z "${PRACTICUM_JUDGE_BASE_URL:-}" ]; then
  export PRACTICUM_JUDGE_CONTEXT_TOKENS=${PRACTICUM_JUDGE_CONTEXT_TOKENS:-2048}
fi
export PRACTICUM_JUDGE_BASE_URL=${PRACTICUM_JUDGE_BASE_URL:-$PRACTICUM_INFERENCE_URL/v1}
export PRACTICUM_JUDGE_MODEL=${PRACTICUM_JUDGE_MODEL:-$BASE}
export PRACTICUM_JUDGE_MAX_TOKENS=${PRACTICUM_JUDGE_MAX_TOKENS:-400}
export PRACTICUM_JUDGE_RATIONALE_MAX_CHARS=${PRACTICUM_JUDGE_RATIONALE_MAX_CHARS:-160}
export PRACTICUM_JUDGE_CORRECTION_MAX_CHARS=${PRACTICUM_JUDGE_CORRECTION_MAX_CHARS:-160}
export PRACTICUM_JUDGE_MAX_CRITERIA=${PRACTICUM_JUDGE_MAX_CRITERIA:-2}
export PRACTICUM_JUDGE_TIMEOUT_S=${PRACTICUM_JUDGE_TIMEOUT_S:-300}
export PRACTICUM_JUDGE_MAX_ATTEMPTS=${PRACTICUM_JUDGE_MAX_ATTEMPTS:-2}
# On a CPU one judgement takes tens of seconds, and every graded outcome the agent reports
# would queue one: judge by hand ("Judge this turn", or a backfill on /judge/) unless asked.
export PRACTICUM_JUDGE_AUTO=${PRACTICUM_JUDGE_AUTO:-false}
# The tour's "run the agent again" goes through this server's gateway.
export PRACTICUM_GATEWAY_URL=${PRACTICUM_GATEWAY_URL:-${PRACTICUM_DEMO_AGENT_BASE_URL:-$URL}}
export PRACTICUM_DEMO_AGENT_EPISODES=${PRACTICUM_DEMO_AGENT_EPISODES:-$(( EPISODES / 3 > 4 ? EPISODES / 3 : 4 ))}
# The tour shows how far the agent has got (n/$EPISODES episodes) until the demo is ready.
export PRACTICUM_DEMO_EPISODES=$EPISODES
CONCURRENCY=${PRACTICUM_DEMO_AGENT_CONCURRENCY:-4}
# No raw progress bars on the console (model conversion, downloads): the logs keep the details.
export HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1
# One torch thread per process: several processes share the cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

say() { printf '\033[1m%s\033[0m\n' "$*"; }

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for p in "$PORT" "$PRACTICUM_INFERENCE_PORT"; do
  port_free "$p" || { echo "port $p is in use: stop what uses it, or set PRACTICUM_PORT / PRACTICUM_INFERENCE_PORT" >&2; exit 1; }
done

# Children in their own process groups: Ctrl-C reaches this script only, and cleanup stops
# each group in turn (the vLLM supervisor first stops its server, which runs in its own session).
pids=()
agent=""
preparing=""
start() {  # start LOGFILE CMD...
  local log=$1; shift
  "$@" >>"$log" 2>&1 &
  pids+=($!)
}

stopping=0
tree() {  # tree PID: PID and every process below it (vLLM runs in a session of its own)
  local child
  echo "$1"
  for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do tree "$child"; done
}
cleanup() {
  [ "$stopping" = 1 ] && return
  stopping=1
  trap '' INT TERM
  # A background job of a script ignores SIGINT: the model's preparation is stopped by name.
  [ -n "$preparing" ] && { kill -TERM "$preparing" 2>/dev/null || true; }
  if [ ${#pids[@]} -eq 0 ] && [ -z "$agent" ]; then return; fi  # nothing started yet
  set +m  # no job-status lines while stopping
  echo; say "Stopping …"
  local pid alive all=("${pids[@]}") everyone=()
  [ -n "$agent" ] && all+=("$agent")
  for pid in "${all[@]}"; do everyone+=($(tree "$pid")); done
  for pid in "${all[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  # Celery finishes its current task on TERM; the vLLM supervisor stops its server (up to 15 s).
  for _ in $(seq 60); do
    alive=0
    for pid in "${everyone[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.5
  done
  for pid in "${everyone[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  say "Stopped."
}
# Ctrl-C or a TERM is how the demo is meant to end: a clean stop exits 0, so `make demo` ends
# without "make: *** [demo] Error 130/143".
trap 'cleanup; exit 0' INT
trap 'cleanup; exit 0' TERM
trap 'cleanup' EXIT

say "Preparing the database and the $BASE model (cached after the first run) …"
$PY manage.py migrate --noinput -v 0
# The conversion's own output (and any progress bars) goes to its log; the console gets one line.
# A first run builds the model (SmolLM2: converted; FAST: fitted to talk), which takes a while
# on a CPU: a line every 15 s says it is still at it.
$PY manage.py prepare_model "$KIND" --name "$BASE" >>"$LOGS/prepare.log" 2>&1 &
preparing=$!
waited=0
while kill -0 "$preparing" 2>/dev/null; do
  sleep 1
  waited=$((waited + 1))
  if [ $((waited % 15)) = 0 ]; then echo "  … preparing $BASE: $waited s (a first run builds it; later runs find it ready)"; fi
done
if ! wait "$preparing"; then
  preparing=""; tail -n 20 "$LOGS/prepare.log" >&2; exit 1
fi
preparing=""
echo "  $BASE is ready (details in $LOGS/prepare.log)"
$PY manage.py demo_setup --serve-base "$BASE"
set -m

# vLLM sets up its own OpenMP threads per core; the one-thread limit is for the other processes.
start "$LOGS/inference.log" env -u OMP_NUM_THREADS $PY manage.py serve_inference --base "$BASE" --port "$PRACTICUM_INFERENCE_PORT"
# Two at once: a run of the demo agent (the tour's "run the agent") holds one for minutes, and
# the progressive release's periodic check, judge calls and releases must not wait behind it.
start "$LOGS/worker.log" .venv/bin/celery -A webapp worker -Q default,deploy --concurrency 2 \
  --hostname "demo@%h" --loglevel WARNING -B --schedule "$DATA_DIR/celerybeat-schedule"
# Training gets its own worker (one job at a time), so judge calls are not stuck behind it.
start "$LOGS/training.log" .venv/bin/celery -A webapp worker -Q training --concurrency 1 \
  --hostname "training@%h" --loglevel WARNING
start "$LOGS/web.log" .venv/bin/uvicorn webapp.asgi:application --host "$HOST" --port "$PORT" --log-level warning

wait_http() {  # wait_http URL SECONDS WHAT [LOG]: until URL answers 200, or a child dies; a line every 15 s
  $PY scripts/wait_ready.py "$1" "$2" "$3" ${4:+--log "$4"} "${pids[@]}"
}

wait_http "$URL/healthz" 120 "the web server" "$LOGS/web.log" || { tail -n 20 "$LOGS/web.log" >&2; exit 1; }
cat <<MSG

  The web server is up at $URL/tour/ — the tour shows how far the demo is (n/$EPISODES episodes);
  it is ready when this console says "Ready".
  Logins:  operator / operator-demo   approver / approver-demo   (also reviewer, admin: <name>-demo)
  Logs:    $LOGS/

MSG
say "Waiting for the inference server ($BASE on vLLM, CPU; one to four minutes: a line every 15 s says where it is) …"
wait_http "$PRACTICUM_INFERENCE_URL/health" 900 "the inference server" "$LOGS/inference.log" || { tail -n 30 "$LOGS/inference.log" >&2; exit 1; }

if [ "${PRACTICUM_DEMO_AGENT:-1}" != 0 ]; then
  # What an earlier start left: training-split episodes, and the base's test-split run.
  count() { $PY manage.py shell -v 0 -c "from feedback.models import Trace; print(Trace.objects.filter(deployment__name='support-bot', source='gateway', metadata__split='$1')[:$2].count())"; }
  have=$(count train "$EPISODES")
  have_test=$(count test "$PRACTICUM_DEMO_AGENT_EPISODES")
  if [ "$have" -lt "$EPISODES" ] || [ "$have_test" -lt "$PRACTICUM_DEMO_AGENT_EPISODES" ]; then
    key=$($PY manage.py create_api_key --deployment support-bot --scopes ingest,feedback --name "make demo agent" --expires-in-days 1 --quiet)
    # In the background (its own process group), so Ctrl-C still reaches this script. The
    # training-split conversations run several at once, as a deployed bot serves several
    # customers (vLLM batches them: on a CPU a step of four costs little more than one). Then
    # the base model on test tasks, one at a time: the tour's "run the agent again" plays the
    # same tasks (seed 0) on the candidate one at a time, and the overview pairs the two runs
    # episode by episode (batched decoding is not bit-identical to one request at a time).
    {
      if [ "$have" -lt "$EPISODES" ]; then
        say "The demo agent works $EPISODES support tasks through the gateway, $CONCURRENCY at once (traces appear as they arrive) …"
        LOG_LEVEL=WARNING $PY manage.py demo_agent --base-url "$URL" --api-key "$key" --split train --episodes "$EPISODES" \
          --concurrency "$CONCURRENCY" || exit
      fi
      if [ "$have_test" -lt "$PRACTICUM_DEMO_AGENT_EPISODES" ]; then
        say "The base model on $PRACTICUM_DEMO_AGENT_EPISODES test tasks, to compare the trained version with …"
        LOG_LEVEL=WARNING $PY manage.py demo_agent --base-url "$URL" --api-key "$key" --split test \
          --episodes "$PRACTICUM_DEMO_AGENT_EPISODES" --seed 0 --comments 0
      fi
    } &
    agent=$!
    wait "$agent" || echo "the demo agent stopped early (exit $?)"
    agent=""
  else
    say "The demo agent's traces are already there ($have); the tour starts from them."
  fi
fi

cat <<MSG

  Ready:   $URL/tour/
  Logins:  operator / operator-demo   approver / approver-demo
  Press Ctrl-C to stop.

MSG
# Until Ctrl-C, or until one of the processes exits. A one-second sleep waited on, not a
# `wait -n` on the services: under load bash was seen to hold a trapped Ctrl-C in `wait -n`
# for minutes, and a wait on a short child lets the trap run within a second.
set +e
dead=""
while [ -z "$dead" ]; do
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null || { dead=$pid; break; }; done
  [ -n "$dead" ] && break
  sleep 1 &
  wait $!
done
wait "$dead"
code=$?
[ "$stopping" = 1 ] && exit 0
echo "a process of the demo exited ($code); see $LOGS/"
exit "$code"

#!/usr/bin/env bash
# Serve the dashboard and a Celery worker on the embedded default (SQLite + filesystem
# broker) with demo data. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
HOST=${PRACTICUM_HOST:-127.0.0.1}
PORT=${PRACTICUM_PORT:-8000}

$PY manage.py demo_setup
$PY manage.py import_traces feedback/demo/example_traces.jsonl --deployment support-bot

pids=()
cleanup() {
  trap - INT TERM EXIT
  echo; echo "Stopping…"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup INT TERM EXIT

.venv/bin/celery -A webapp worker -Q default,deploy --concurrency 1 --loglevel WARNING \
  -B --schedule "${PRACTICUM_DATA_DIR:-var}/celerybeat-schedule" &
pids+=($!)
# Training gets its own worker (one job at a time), so judge calls are not stuck behind it.
.venv/bin/celery -A webapp worker -Q training --concurrency 1 --hostname training@%h --loglevel WARNING &
pids+=($!)
.venv/bin/uvicorn webapp.asgi:application --host "$HOST" --port "$PORT" --log-level warning &
pids+=($!)

sleep 2
cat <<MSG

  Practicum is running:  http://$HOST:$PORT/
  Log in as  operator / operator-demo   (or reviewer, approver, admin: <name>-demo)
  Press Ctrl-C to stop.

MSG
wait -n "${pids[@]}"

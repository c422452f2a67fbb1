#!/usr/bin/env bash
# A local dtrain cluster on 127.0.0.1, in the background:
#   deploy/local/cluster.sh start [--port N]   starts dtrain-coordinator (default port 29610)
#   deploy/local/cluster.sh stop                stops it cleanly (SIGTERM, then waits)
#   deploy/local/cluster.sh status
# State (pid, port, log) lives in $DTRAIN_LOCAL_DIR (default: build/local-cluster).
# Workers join this script once dtrain-worker exists (see docs/DECISIONS.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
state=${DTRAIN_LOCAL_DIR:-$root/build/local-cluster}
bin=${DTRAIN_BIN_DIR:-$root/build}
mkdir -p "$state"

running() { [ -f "$state/coordinator.pid" ] && kill -0 "$(cat "$state/coordinator.pid")" 2>/dev/null; }

case "${1:-}" in
  start)
    port=29610
    [ "${2:-}" = "--port" ] && port="$3"
    if running; then echo "coordinator already running on 127.0.0.1:$(cat "$state/port")"; exit 0; fi
    rm -f "$state/port"
    "$bin/coordinator/dtrain-coordinator" --listen="127.0.0.1:$port" --port_file="$state/port" \
      >"$state/coordinator.log" 2>&1 &
    echo $! > "$state/coordinator.pid"
    for _ in $(seq 100); do [ -s "$state/port" ] && break; sleep 0.1; done
    if ! [ -s "$state/port" ]; then
      echo "coordinator did not start; its log:" >&2; cat "$state/coordinator.log" >&2; exit 1
    fi
    echo "coordinator serving on 127.0.0.1:$(cat "$state/port") (log: $state/coordinator.log)"
    ;;
  stop)
    if running; then
      pid=$(cat "$state/coordinator.pid")
      kill -TERM "$pid"
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; echo "coordinator killed"; else echo "coordinator stopped"; fi
    else
      echo "coordinator not running"
    fi
    rm -f "$state/coordinator.pid" "$state/port"
    ;;
  status)
    if running; then echo "coordinator running on 127.0.0.1:$(cat "$state/port")"; else echo "coordinator not running"; exit 1; fi
    ;;
  *)
    echo "usage: deploy/local/cluster.sh start [--port N] | stop | status" >&2; exit 2 ;;
esac

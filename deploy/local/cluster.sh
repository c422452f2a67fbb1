#!/usr/bin/env bash
# A local dtrain cluster on 127.0.0.1, in the background:
#   deploy/local/cluster.sh start [--port N] [--http_port N] [--workers N] [--threads N]
#                                          a coordinator (dashboard on 29612) and N workers (default 2)
#   deploy/local/cluster.sh stop                              stops them cleanly (SIGTERM, then waits)
#   deploy/local/cluster.sh status
#   deploy/local/cluster.sh cpus [--workers N] [--threads N]   each worker's cores, one line each
# Port 0 picks a free coordinator port. Workers listen on free ports and register themselves;
# each gets an equal share of this machine's cores (--threads) and, when the shares fit the cores
# this shell may use, is pinned to its own (--cpus; --no-pin leaves the scheduler to place them,
# --cpus=none; shares that do not fit the cores are not pinned either).
# State (pids, port, logs, jobs) lives in $DTRAIN_LOCAL_DIR (default: build/local-cluster).
# $DTRAIN_WORKER_FLAGS, if set, is added to every worker's flags (e.g. --rank_isolation=process).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
state=${DTRAIN_LOCAL_DIR:-$root/build/local-cluster}
bin=${DTRAIN_BIN_DIR:-$root/build}
mkdir -p "$state"

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# SIGTERM, up to 10 s for a clean exit, then SIGKILL.
stop_one() {
  local pidfile=$1 name=$2
  if alive "$pidfile"; then
    local pid; pid=$(cat "$pidfile")
    kill -TERM "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; echo "$name killed"; else echo "$name stopped"; fi
  fi
  rm -f "$pidfile"
}

# The cores this shell may run on (its Cpus_allowed_list, e.g. 0-3,6), one per line.
allowed_cpus() {
  local list part
  list=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/$$/status)
  for part in ${list//,/ }; do
    if [[ $part == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
  done
}

# Worker i's cores: the i-th run of $threads allowed cores; nothing when the workers' shares
# do not fit (they would share cores, which pinning would make worse, not better).
worker_cpus() {  # i
  if [ $(( workers * threads )) -le "${#allowed[@]}" ]; then
    local slice=("${allowed[@]:$(( $1 * threads )):$threads}")
    (IFS=,; echo "${slice[*]}")
  fi
}

cmd=${1:-}
[ $# -gt 0 ] && shift
port=29610 workers=2 threads=0 http_port=29612 pin=1
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port=$2; shift 2 ;;
    --http_port) http_port=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --no-pin) pin=0; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
case "$workers" in
  ''|*[!0-9]*|0) echo "--workers takes a whole number of workers, at least 1 (got '$workers')" >&2; exit 2 ;;
esac
case "$threads" in
  ''|*[!0-9]*) echo "--threads takes a whole number (0: the cores split between the workers; got '$threads')" >&2; exit 2 ;;
esac
workers=$((10#$workers)) threads=$((10#$threads))  # "08" is eight, not a bad octal number
cores=$(nproc)
mapfile -t allowed < <(allowed_cpus)
if [ "$threads" -le 0 ]; then threads=$(( cores / workers )); [ "$threads" -ge 1 ] || threads=1; fi

case "$cmd" in
  cpus)
    for i in $(seq 0 $((workers - 1))); do worker_cpus "$i"; done
    ;;
  start)
    if alive "$state/coordinator.pid"; then
      echo "already running: coordinator on 127.0.0.1:$(cat "$state/port")"; exit 0
    fi
    rm -f "$state/port" "$state/http_port"
    # With --port 0 the dashboard takes a free port too.
    [ "$port" = 0 ] && http_port=0
    "$bin/coordinator/dtrain-coordinator" --listen="127.0.0.1:$port" --port_file="$state/port" \
      --http_listen="127.0.0.1:$http_port" --http_port_file="$state/http_port" \
      --state-dir="$state/state" >"$state/coordinator.log" 2>&1 &
    echo $! > "$state/coordinator.pid"
    for _ in $(seq 100); do [ -s "$state/port" ] && break; sleep 0.1; done
    if ! [ -s "$state/port" ]; then
      echo "coordinator did not start; its log:" >&2; cat "$state/coordinator.log" >&2; exit 1
    fi
    address="127.0.0.1:$(cat "$state/port")"
    echo "coordinator serving on $address (log: $state/coordinator.log)"
    echo "dashboard: http://127.0.0.1:$(cat "$state/http_port")/"
    pinned=""
    for i in $(seq 0 $((workers - 1))); do
      rm -f "$state/worker-$i.port"
      cpus=""; [ "$pin" = 1 ] && cpus=$(worker_cpus "$i")
      [ -n "$cpus" ] && pinned="$pinned local-$i:$cpus"
      # The launcher knows the whole layout: its list, or none (the worker's own --cpus=auto
      # would otherwise override the --threads asked for here).
      "$bin/worker/dtrain-worker" --coordinator="$address" --listen=127.0.0.1:0 \
        --port_file="$state/worker-$i.port" --name="local-$i" --threads="$threads" \
        --cpus="${cpus:-none}" ${DTRAIN_WORKER_FLAGS:-} >"$state/worker-$i.log" 2>&1 &
      echo $! > "$state/worker-$i.pid"
    done
    for i in $(seq 0 $((workers - 1))); do
      for _ in $(seq 300); do [ -s "$state/worker-$i.port" ] && break; sleep 0.1; done
      if ! [ -s "$state/worker-$i.port" ]; then
        echo "worker $i did not start; its log:" >&2; cat "$state/worker-$i.log" >&2; exit 1
      fi
    done
    echo "$workers worker(s) serving, $threads compute thread(s) each (logs: $state/worker-*.log)"
    [ -n "$pinned" ] && echo "steps pinned to cores:$pinned"
    echo "use it with: export DTRAIN_COORDINATOR=$address"
    ;;
  stop)
    # Workers first: each leaves its job's group cleanly while the coordinator still serves.
    for pidfile in "$state"/worker-*.pid; do
      [ -e "$pidfile" ] || continue
      stop_one "$pidfile" "$(basename "$pidfile" .pid)"
    done
    stop_one "$state/coordinator.pid" coordinator
    rm -f "$state/port" "$state/http_port" "$state"/worker-*.port
    ;;
  status)
    if alive "$state/coordinator.pid"; then
      echo "coordinator running on 127.0.0.1:$(cat "$state/port")"
    else
      echo "coordinator not running"; exit 1
    fi
    for pidfile in "$state"/worker-*.pid; do
      [ -e "$pidfile" ] || continue
      if alive "$pidfile"; then echo "$(basename "$pidfile" .pid) running"; else echo "$(basename "$pidfile" .pid) not running"; fi
    done
    ;;
  *)
    echo "usage: deploy/local/cluster.sh start [--port N] [--http_port N] [--workers N] [--threads N] [--no-pin] | stop | status | cpus [--workers N] [--threads N]" >&2; exit 2 ;;
esac

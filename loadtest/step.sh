#!/usr/bin/env bash
# Step mode against a cluster on this machine: builds the edge, the router
# and the load generator (no -race), starts the floor (`loadtest floor`) as
# a process of its own, two edges (MOBILE_ROUTER=off) and one router
# (AGENT=demo) on the local Redis (127.0.0.1:6379) and NATS (127.0.0.1:4222)
# with key and subject prefixes of their own and MOBILE_PPROF=on, then runs
#
#   loadtest step -url <edge1>,<edge2> -token … -deliver <router> -deliver-token … -floor <floor> "$@"
#
# so any flag of `loadtest step` may follow (a later flag wins).
#
# STEP_EDGES=1 puts the phones on the first edge only.
# PROFILE_AT=<s> PROFILE_SECONDS=<s> PROFILE_DIR=<dir>: PROFILE_AT seconds
# after the load generator starts, take CPU profiles of the router and of
# the first edge for PROFILE_SECONDS (default 20) into PROFILE_DIR
# (router.pprof, edge1.pprof); read them with `go tool pprof -top FILE`.
# Over the same window it counts the cores used by each process on the
# path (services, load generator, Redis, NATS) into PROFILE_DIR/cpu.txt.
# STEP_LOGS=<dir> keeps the services' logs.
# EDGE_BIN=<file> ROUTER_BIN=<file> run those binaries instead of building
# the edge and the router (e.g. an earlier commit's, to compare in one run).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH:/usr/sbin"

WORK="$(mktemp -d)"
PIDS=()
# shellcheck source=loadtest/services.sh
source loadtest/services.sh
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ -n "${STEP_LOGS:-}" ]; then mkdir -p "$STEP_LOGS" && cp "$WORK"/*.log "$STEP_LOGS"/ 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

build_binaries

ID="st$(random | cut -c1-10)"
TOKEN="$(random)"
DELIVER_TOKEN="$(random)"
export NATS_URL=nats://127.0.0.1:4222 REDIS_URL=redis://127.0.0.1:6379
export REDIS_PREFIX="$ID:" NATS_PREFIX="$ID."
export MOBILE_ADMIN_LISTEN=127.0.0.1:0 MOBILE_DRAIN_WINDOW=2 MOBILE_PPROF=on

start floor MOBILE_TOKEN="$TOKEN" "$WORK/loadtest" floor
start_gateway
FLOOR="$(url_of floor "floor listening")"
ADMIN_EDGE1="$(url_of edge1 "admin listening")"
ADMIN_ROUTER="$(url_of router "admin listening")"
EDGES="$EDGE1,$EDGE2"
if [ "${STEP_EDGES:-2}" = 1 ]; then EDGES="$EDGE1"; fi
echo "floor $FLOOR, edges $EDGES, router $ROUTER (REDIS_PREFIX=$REDIS_PREFIX NATS_PREFIX=$NATS_PREFIX)" >&2

# cpu_times: "name ticks" of every process on the path of an operation:
# the services, the load generator, Redis and NATS.
cpu_times() {
  local name pid
  ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
  for name in floor edge1 edge2 router; do
    echo "$name $(ticks "$(eval echo "\$PID_$name")")"
  done
  for name in loadtest redis-server nats-server; do
    for pid in $(pgrep -x "$name"); do
      if [ "$pid" != "$(eval echo "\$PID_floor")" ]; then echo "$name $(ticks "$pid")"; fi
    done
  done
}

# cpu_share BEFORE AFTER SECONDS: the cores each process used in between.
cpu_share() {
  local hz
  hz="$(getconf CLK_TCK)"
  echo "cores used over ${3}s (of $(nproc)):"
  paste -d' ' <(echo "$1") <(echo "$2") |
    awk -v hz="$hz" -v t="$3" '$1 == $3 { n[$1] += ($4 - $2) / hz / t } END { for (k in n) { printf "  %-13s %.2f\n", k, n[k]; s += n[k] }; printf "  %-13s %.2f\n", "total", s }'
}

if [ -n "${PROFILE_AT:-}" ]; then
  secs="${PROFILE_SECONDS:-20}"
  dir="${PROFILE_DIR:?PROFILE_DIR is needed with PROFILE_AT}"
  mkdir -p "$dir"
  (
    sleep "$PROFILE_AT"
    echo "$(date +%T) profiling the router and edge 1 for ${secs}s" >&2
    before="$(cpu_times)" t0="$(date +%s.%N)"
    curl -fsS -o "$dir/router.pprof" "$ADMIN_ROUTER/debug/pprof/profile?seconds=$secs" &
    curl -fsS -o "$dir/edge1.pprof" "$ADMIN_EDGE1/debug/pprof/profile?seconds=$secs" &
    wait
    after="$(cpu_times)" t1="$(date +%s.%N)"
    cpu_share "$before" "$after" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')" | tee "$dir/cpu.txt" >&2
  ) &
  PROFILER=$!
fi

status=0
LOADTEST_DELIVER_TOKEN="$DELIVER_TOKEN" "$WORK/loadtest" step -url "$EDGES" -token "$TOKEN" \
  -deliver "$ROUTER" -floor "$FLOOR" "$@" || status=$?
if [ -n "${PROFILER:-}" ]; then wait "$PROFILER" || true; fi
all_alive floor edge1 edge2 router || status=1
exit "$status"

#!/usr/bin/env bash
# Server CPU of idle authenticated phones on ONE edge in cluster mode: the
# edge, a Redis and a NATS server of the script's own (so that their CPU is
# the gateway's alone), and a router (AGENT=demo). Builds the binaries (no
# -race), connects IDLE_PHONES phones (10,000) from load generator
# processes of IDLE_PER_PROCESS (5,000) each that hold them idle, lets them
# settle for one owner TTL (30 s: a heartbeat of every kind has run), then
# reads each server's CPU time (utime + stime of /proc/<pid>/stat) over
# IDLE_SECONDS (60) and prints it per phone, in µs of CPU per second:
#
#   edge, Redis, NATS server, and their sum (the router has no phone work)
#
# The same window is first read with no phone, and its CPU is taken off:
# what a server spends on its own timers is not a phone's.
#
# IDLE_PHONES=<n> IDLE_PER_PROCESS=<n> IDLE_SECONDS=<s> IDLE_SETTLE=<s>
# EDGE_BIN=<file> ROUTER_BIN=<file> run those binaries (an earlier commit's)
# IDLE_DIR=<dir> keeps the logs
#
# It exits 0 when every phone stayed connected through the reading.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH:/usr/sbin"
PHONES="${IDLE_PHONES:-10000}"
PER_PROCESS="${IDLE_PER_PROCESS:-5000}"
WINDOW="${IDLE_SECONDS:-60}"
SETTLE="${IDLE_SETTLE:-30}"
ulimit -n "$(ulimit -Hn)"

WORK="$(mktemp -d)"
PIDS=()
LOADTESTS=()
# shellcheck source=loadtest/services.sh
source loadtest/services.sh
# shellcheck disable=SC2317 # called by the trap, not unreachable
cleanup() {
  stop_all "${LOADTESTS[@]}"
  keep_work "${IDLE_DIR:-}"
}
trap cleanup EXIT

build_binaries
TOKEN="$(random)"
REDIS_PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
start redis redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no
export REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
start_nats
export MOBILE_ADMIN_LISTEN=127.0.0.1:0 MOBILE_DRAIN_WINDOW=2
start edge MOBILE_TOKEN="$TOKEN" MOBILE_ROUTER=off MOBILE_LISTEN=127.0.0.1:0 "$WORK/edge"
start router MOBILE_ROUTER_LISTEN=127.0.0.1:0 AGENT=demo "$WORK/router"
EDGE="$(url_of edge "gateway listening")"
ADMIN="$(url_of edge "admin listening")"
url_of router "router listening" >/dev/null

# ticks PID: the CPU time of PID so far, in clock ticks (utime + stime).
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# shellcheck disable=SC2154 # PID_* are set by start
pids=("$PID_edge" "$PID_redis" "$PID_nats")
names=(edge Redis NATS)
# window NAME: the CPU ticks of each server over WINDOW seconds, into NAME.
window() {
  local -n into="$1"
  local i
  declare -a t0
  for i in "${!pids[@]}"; do t0[i]="$(ticks "${pids[i]}")"; done
  sleep "$WINDOW" # the measuring window
  for i in "${!pids[@]}"; do into[i]=$(($(ticks "${pids[i]}") - t0[i])); done
}
declare -a idle busy
echo "== settling ${SETTLE}s, then reading ${WINDOW}s with no phone" >&2
sleep "$SETTLE"
window idle

connect_phones "$EDGE" "$PHONES" "$PER_PROCESS" 300 "$ADMIN"
echo "== $PHONES phones connected; settling ${SETTLE}s, then reading ${WINDOW}s" >&2
sleep "$SETTLE" # every heartbeat, sweep and keepalive has run once
window busy

curl -fsS -o "$WORK/metrics-end.txt" "$ADMIN/metrics"
held="$(metric "$WORK/metrics-end.txt" hermes_connections)"
hz="$(getconf CLK_TCK)"
echo
echo "Server CPU over ${WINDOW}s, with no phone and with $PHONES idle phones on one edge ($held still connected at the end):"
printf '  %-6s %10s %14s %30s\n' "" "no phone" "$PHONES phones" "per phone (the difference)"
ti=0 tb=0
row() { # name idle busy
  awk -v n="$1" -v a="$2" -v b="$3" -v hz="$hz" -v w="$WINDOW" -v p="$PHONES" 'BEGIN {
    printf "  %-6s %7.0f ms %11.0f ms %16.2f µs per second\n", n, a * 1000 / hz, b * 1000 / hz, (b - a) * 1e6 / hz / w / p }'
}
for i in "${!pids[@]}"; do
  row "${names[i]}" "${idle[i]}" "${busy[i]}"
  ti=$((ti + idle[i])) tb=$((tb + busy[i]))
done
row total "$ti" "$tb"
[ "$held" = "$PHONES" ]

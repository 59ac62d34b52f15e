#!/usr/bin/env bash
# A hundred thousand phones on one box: HK_EDGES edges (6; each under the
# 20,000 open files one process may hold here), HK_ROUTERS routers (2,
# AGENT=demo), a Redis Cluster of HK_REDIS_MASTERS masters (3) and a NATS
# cluster of HK_NATS servers (3), all started by this script on loopback
# ports, and HK_PHONES phones (100,000) from load generator processes of at
# most HK_PER_PROCESS (8,400) each, split in turn over every edge, each
# process from 127.0.0.2–254. Then:
#
#   1. no phone: the servers' CPU over HK_WINDOW seconds (60) and RSS;
#   2. every phone connected and idle, HK_SETTLE (30) seconds after the last
#      connected: the same window again;
#   3. texts and deliveries at docs/capacity.md's assumed rates (a text per
#      phone per 10 min: N/600 a second; a delivery per phone per hour:
#      N/3,600 a second, to the routers in turn) for HK_DURATION (10m): the
#      same, over the phase less its first and last 15 s.
#
# It prints, per tier (edges, routers, Redis, NATS, and the load generators
# apart), RSS and CPU per phone, idle and under the traffic (the servers'
# net of the no-phone window), the time to connect every phone, and the
# load generators' merged report: every text and delivery lost (not
# answered within 60 s of the last send) and their latency percentiles.
#
# HK_PHONES HK_PER_PROCESS HK_EDGES HK_ROUTERS HK_REDIS_MASTERS HK_NATS
# HK_WINDOW HK_SETTLE HK_DURATION HK_RATE HK_DELIVER_RATE (per second, all
# processes together; default from HK_PHONES as above)
# HK_CONNECT (120) seconds allowed for every phone to connect: the phones
# are held idle that long plus the settle and the window, then send
# HK_DIR=<dir> keeps the logs and the JSON reports
# EDGE_BIN=<file> ROUTER_BIN=<file> run those binaries
#
# It exits 0 when every phone connected and stayed, and nothing was lost.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH:/usr/sbin"
PHONES="${HK_PHONES:-100000}"
PER_PROCESS="${HK_PER_PROCESS:-8400}"
EDGES="${HK_EDGES:-6}"
ROUTERS="${HK_ROUTERS:-2}"
MASTERS="${HK_REDIS_MASTERS:-3}"
NATS_SERVERS="${HK_NATS:-3}"
WINDOW="${HK_WINDOW:-60}"
SETTLE="${HK_SETTLE:-30}"
CONNECT="${HK_CONNECT:-120}"
DURATION="${HK_DURATION:-10m}"
RATE="${HK_RATE:-$(awk -v n="$PHONES" 'BEGIN { printf "%.1f", n / 600 }')}"
DELIVER_RATE="${HK_DELIVER_RATE:-$(awk -v n="$PHONES" 'BEGIN { printf "%.1f", n / 3600 }')}"
ulimit -n "$(ulimit -Hn)"

WORK="$(mktemp -d)"
PIDS=()
LOADTESTS=()
# shellcheck source=loadtest/services.sh
source loadtest/services.sh
# shellcheck disable=SC2317 # called by the trap, not unreachable
cleanup() {
  # The phones and the gateway first, so the edges release their phones
  # while Redis and NATS still run; then the rest.
  local p first=("${LOADTESTS[@]}")
  if declare -F tier_pids >/dev/null; then
    mapfile -t -O "${#first[@]}" first < <(tier_pids edges; tier_pids routers)
  fi
  for p in "${first[@]}"; do [ -n "$p" ] && kill -TERM "$p" 2>/dev/null; done
  for p in "${first[@]}"; do [ -n "$p" ] && wait "$p" 2>/dev/null; done
  stop_all
  keep_work "${HK_DIR:-}"
}
trap cleanup EXIT

# free_port: a port free now, of 20000–55000 (a Redis Cluster node's bus
# port is its port + 10,000, so its port must be at most 55,535).
free_port() {
  python3 -c '
import random, socket
while True:
    p = random.randint(20000, 55000)
    for port in (p, p + 10000):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            break
        finally:
            s.close()
    else:
        print(p)
        break'
}
# wait_for WHAT SECONDS COMMAND...: runs COMMAND every 0.2 s until it
# succeeds; fails saying WHAT after SECONDS.
wait_for() {
  local what="$1" secs="$2" i
  shift 2
  for i in $(seq 1 $((secs * 5))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "$what: not within ${secs}s" >&2
  return 1
}

build_binaries
TOKEN="$(random)"
DELIVER_TOKEN="$(random)"

echo "== a Redis Cluster of $MASTERS masters, a NATS cluster of $NATS_SERVERS servers" >&2
REDIS_ADDRS=()
for i in $(seq 1 "$MASTERS"); do
  port="$(free_port)"
  mkdir -p "$WORK/redis$i"
  start "redis$i" redis-server --bind 127.0.0.1 --port "$port" --cluster-enabled yes \
    --cluster-config-file nodes.conf --dir "$WORK/redis$i" --save "" --appendonly no --maxclients 10000
  REDIS_ADDRS+=("127.0.0.1:$port")
  wait_for "redis$i PING" 15 redis-cli -p "$port" PING
done
redis-cli --cluster create "${REDIS_ADDRS[@]}" --cluster-replicas 0 --cluster-yes >"$WORK/redis-create.log"
for a in "${REDIS_ADDRS[@]}"; do
  wait_for "Redis Cluster node $a cluster_state:ok" 60 bash -c "redis-cli -h ${a%:*} -p ${a#*:} CLUSTER INFO | grep -q cluster_state:ok"
done
REDIS_URL="redis://${REDIS_ADDRS[0]}"
for a in "${REDIS_ADDRS[@]:1}"; do
  if [[ "$REDIS_URL" == *\?* ]]; then REDIS_URL+="&addr=$a"; else REDIS_URL+="?addr=$a"; fi
done
export REDIS_URL REDIS_MODE=cluster

NATS_CLIENT=() NATS_ROUTE=() NATS_MONS=()
for i in $(seq 1 "$NATS_SERVERS"); do
  NATS_CLIENT+=("$(free_port)") NATS_ROUTE+=("$(free_port)") NATS_MONS+=("$(free_port)")
done
routes="$(for p in "${NATS_ROUTE[@]}"; do printf 'nats://127.0.0.1:%s,' "$p"; done)"
for i in $(seq 0 $((NATS_SERVERS - 1))); do
  start "nats$((i + 1))" nats-server -a 127.0.0.1 -p "${NATS_CLIENT[i]}" -m "${NATS_MONS[i]}" \
    --cluster_name hundredk --cluster "nats://127.0.0.1:${NATS_ROUTE[i]}" --routes "${routes%,}"
done
for i in $(seq 0 $((NATS_SERVERS - 1))); do
  wait_for "NATS server $((i + 1)) routed to the others" 30 bash -c \
    "curl -fsS http://127.0.0.1:${NATS_MONS[i]}/routez | grep -qE '\"num_routes\": *([$((NATS_SERVERS - 1))-9]|[1-9][0-9])'"
done
NATS_URL="$(for p in "${NATS_CLIENT[@]}"; do printf 'nats://127.0.0.1:%s,' "$p"; done)"
export NATS_URL="${NATS_URL%,}" MOBILE_ADMIN_LISTEN=127.0.0.1:0

echo "== $EDGES edges, $ROUTERS routers" >&2
EDGE_URLS="" EDGE_ADMINS=()
for i in $(seq 1 "$EDGES"); do
  start "edge$i" MOBILE_TOKEN="$TOKEN" MOBILE_ROUTER=off MOBILE_LISTEN=127.0.0.1:0 "$WORK/edge"
done
for i in $(seq 1 "$EDGES"); do
  EDGE_URLS+="$(url_of "edge$i" "gateway listening"),"
  EDGE_ADMINS+=("$(url_of "edge$i" "admin listening")")
done
EDGE_URLS="${EDGE_URLS%,}"
ROUTER_URLS=()
for i in $(seq 1 "$ROUTERS"); do
  start "router$i" MOBILE_ROUTER_LISTEN=127.0.0.1:0 MOBILE_DELIVER_TOKENS="$DELIVER_TOKEN" AGENT=demo "$WORK/router"
done
for i in $(seq 1 "$ROUTERS"); do ROUTER_URLS+=("$(url_of "router$i" "router listening")"); done

# The tiers and their processes.
tier_pids() {
  case "$1" in
    edges) for i in $(seq 1 "$EDGES"); do eval echo "\$PID_edge$i"; done ;;
    routers) for i in $(seq 1 "$ROUTERS"); do eval echo "\$PID_router$i"; done ;;
    Redis) for i in $(seq 1 "$MASTERS"); do eval echo "\$PID_redis$i"; done ;;
    NATS) for i in $(seq 1 "$NATS_SERVERS"); do eval echo "\$PID_nats$i"; done ;;
    clients) printf '%s\n' "${LOADTESTS[@]}" ;;
  esac
}
TIERS=(edges routers Redis NATS clients)
# ticks TIER: the CPU time of the tier's processes so far, in clock ticks.
ticks() { tier_pids "$1" | while read -r p; do [ -n "$p" ] || continue; awk '{ print $14 + $15 }' "/proc/$p/stat"; done | awk '{ s += $1 } END { print s + 0 }'; }
# rss TIER: the tier's resident memory, in KiB.
rss() { tier_pids "$1" | while read -r p; do [ -n "$p" ] || continue; awk '/^VmRSS:/ { print $2 }' "/proc/$p/status"; done | awk '{ s += $1 } END { print s + 0 }'; }
# measure NAME SECONDS: every tier's CPU ticks over SECONDS into
# CPU_<NAME>_<tier>, its RSS at the end into RSS_<NAME>_<tier>.
measure() {
  local name="$1" secs="$2" t
  declare -A t0
  for t in "${TIERS[@]}"; do t0[$t]="$(ticks "$t")"; done
  sleep "$secs" # the measuring window
  for t in "${TIERS[@]}"; do
    eval "CPU_${name}_$t=$(($(ticks "$t") - t0[$t]))"
    eval "RSS_${name}_$t=$(rss "$t")"
  done
  eval "SECS_$name=$secs"
}

echo "== $(date +%T) no phone: settling 10 s, then reading ${WINDOW}s" >&2
sleep 10 # the servers' start-up work is done
measure none "$WINDOW"

procs=$(((PHONES + PER_PROCESS - 1) / PER_PROCESS))
# The idle window must end before the first process starts its messages.
SOAK=$((CONNECT + SETTLE + WINDOW + 30))
echo "== $(date +%T) $PHONES phones from $procs load generator processes over $EDGES edges; texts $RATE/s, deliveries $DELIVER_RATE/s for $DURATION after a ${SOAK}s hold" >&2
connect_start=$SECONDS
for i in $(seq 1 "$procs"); do
  n=$((PHONES / procs + (i <= PHONES % procs ? 1 : 0)))
  "$WORK/loadtest" -url "$EDGE_URLS" -token "$TOKEN" -conns "$n" -soak "${SOAK}s" -duration "$DURATION" \
    -rate "$(awk -v r="$RATE" -v p="$procs" 'BEGIN { print r / p }')" \
    -deliver "${ROUTER_URLS[$(((i - 1) % ROUTERS))]}" -deliver-token "$DELIVER_TOKEN" \
    -deliver-rate "$(awk -v r="$DELIVER_RATE" -v p="$procs" 'BEGIN { print r / p }')" \
    -storm 0 -answer-wait 60s -dial-concurrency 100 -retry 2m -progress 30s \
    -json "$WORK/hk-$i.json" >"$WORK/hk-report-$i.txt" 2>"$WORK/hk-loadtest-$i.log" &
  LOADTESTS+=("$!")
done
# all_logged TEXT: every load generator logged TEXT; fails when one ended.
all_logged() {
  local i
  for i in $(seq 1 "$procs"); do
    grep -q "$1" "$WORK/hk-loadtest-$i.log" 2>/dev/null && continue
    if ! kill -0 "${LOADTESTS[$((i - 1))]}" 2>/dev/null; then
      echo "load generator $i ended early; its log:" >&2
      tail -n 20 "$WORK/hk-loadtest-$i.log" >&2
      exit 1
    fi
    return 1
  done
}
until all_logged ' connected in '; do sleep 0.5; done
CONNECT_SECS=$((SECONDS - connect_start))
grep -h ' connected in ' "$WORK"/hk-loadtest-*.log >&2
held=0
for a in "${EDGE_ADMINS[@]}"; do
  curl -fsS -o "$WORK/metrics.txt" "$a/metrics"
  held=$((held + $(metric "$WORK/metrics.txt" hermes_connections)))
done
echo "== $(date +%T) $held phones on the edges after ${CONNECT_SECS}s; settling ${SETTLE}s, then reading ${WINDOW}s" >&2
sleep "$SETTLE" # every heartbeat, sweep and keepalive has run once
measure idle "$WINDOW"
for i in $(seq 1 "$procs"); do
  if grep -q ' held; sending ' "$WORK/hk-loadtest-$i.log"; then
    echo "load generator $i started its messages inside the idle window: raise the hold" >&2
    exit 1
  fi
done

until all_logged ' held; sending '; do sleep 0.5; done
phase_secs="$(awk -v d="$DURATION" 'BEGIN { n = d + 0; if (d ~ /m$/) n *= 60; print int(n) }')"
echo "== $(date +%T) messages; reading the $((phase_secs - 30))s after the first 15 s" >&2
sleep 15 # the phase's start: every pacer running
measure traffic $((phase_secs - 30))

status=0
for pid in "${LOADTESTS[@]}"; do wait "$pid" || status=1; done
LOADTESTS=()
echo "== load generators exited $status; merged report:"
"$WORK/loadtest" merge -json "$WORK/hk.json" "$WORK"/hk-[0-9]*.json || status=1
echo "== ERROR lines in the servers' logs"
grep -c '"level":"ERROR"' "$WORK"/edge*.log "$WORK"/router*.log || true

hz="$(getconf CLK_TCK)"
echo
echo "$PHONES phones ($held held) on $EDGES edges, $ROUTERS routers, Redis Cluster of $MASTERS, NATS cluster of $NATS_SERVERS; every phone connected in ${CONNECT_SECS}s"
echo "Per phone: CPU in µs a second (servers: net of the no-phone window) and RSS in KiB (servers: net of their RSS with no phone)"
printf '  %-8s %14s %14s %12s %12s %10s\n' tier "idle CPU" "traffic CPU" "idle RSS" "traffic RSS" "RSS MiB"
server_idle=0 server_traffic=0
for t in "${TIERS[@]}"; do
  eval "n=\$CPU_none_$t i=\$CPU_idle_$t b=\$CPU_traffic_$t rn=\$RSS_none_$t ri=\$RSS_idle_$t rb=\$RSS_traffic_$t"
  # shellcheck disable=SC2154 # set by the eval
  if [ "$t" = clients ]; then n=0 rn=0; fi
  row="$(awk -v n="$n" -v i="$i" -v b="$b" -v rn="$rn" -v ri="$ri" -v rb="$rb" -v hz="$hz" \
    -v w0="$SECS_none" -v wi="$SECS_idle" -v wb="$SECS_traffic" -v p="$PHONES" 'BEGIN {
      base = n / w0
      ci = (i / wi - base) * 1e6 / hz / p
      cb = (b / wb - base) * 1e6 / hz / p
      printf "%.3f %.3f %.2f %.2f %.0f", ci, cb, (ri - rn) / p, (rb - rn) / p, rb / 1024 }')"
  read -r ci cb pri prb mib <<<"$row"
  printf '  %-8s %11s µs %11s µs %8s KiB %8s KiB %10s\n' "$t" "$ci" "$cb" "$pri" "$prb" "$mib"
  if [ "$t" != clients ]; then
    server_idle="$(awk -v a="$server_idle" -v b="$ci" 'BEGIN { print a + b }')"
    server_traffic="$(awk -v a="$server_traffic" -v b="$cb" 'BEGIN { print a + b }')"
  fi
done
printf '  %-8s %11s µs %11s µs\n' servers "$server_idle" "$server_traffic"
[ "$held" = "$PHONES" ] && [ "$status" = 0 ]

#!/usr/bin/env bash
# An edge lost, or every edge rolled, under many phones while the agent
# answers texts and cron delivers: three edges (MOBILE_ROUTER=off), one
# router (AGENT=demo, a deliver token), a NATS server of its own and the
# local Redis (127.0.0.1:6379) with a key prefix of its own. EK_PHONES
# phones connect from several load generator processes (-reconnect: a phone
# whose connection ends comes back, with the SDKs' backoff and at least a
# 503's Retry-After, to the next edge in turn, and sends its unanswered
# texts again), spread over the three edges; after EK_SOAK idle and
# EK_BEFORE seconds of texts and deliveries (with a ttl, to every phone in
# turn, away or not), either
#
#   kill: edge1 is SIGKILLed; its phones come back to edge2 and edge3;
#   roll: each edge in turn gets SIGTERM, drains (1001 to its phones over
#         MOBILE_DRAIN_WINDOW), exits, is started again on the same ports
#         and is ready (/readyz 200) before the next;
#
# and the texts and deliveries go on until EK_DURATION is over; then every
# text must be answered and every accepted delivery received (within
# -answer-wait 60s of the last send).
#
# EK_MODES="kill roll"  which runs, one after the other, each on a fresh cluster
# EK_PHONES=20000   phones (at most 9,000 per process; EK_PER_PROCESS, 7000)
# EK_SOAK=10s       idle after the last phone connected, before the texts
# EK_BEFORE=20      seconds of texts and deliveries before the kill or the roll
# EK_DURATION=100s  the message phase (it must outlast the roll and the return)
# EK_RATE=200       texts per second, all processes together
# EK_DELIVER_RATE=50  deliveries per second, all processes together
# EK_TTL=600        the deliveries' ttl (seconds)
# EK_EDGE_ENV="VAR=value …"  more settings of the edges, e.g.
#                   "MOBILE_MAX_HELLO_MIB=1024 MOBILE_MAX_HELLO_CONNS=100000"
#                   to run without shedding
# EDGE_BIN=<file> ROUTER_BIN=<file> run those binaries
# EK_DIR=<dir>      keeps the logs, the JSON reports and the samples
#
# For each run it prints the merged report of the load generators (phones
# dropped and back, the time from the first drop until the last phone was
# back, the reconnect handshakes from first attempt to ready, texts and
# deliveries lost, errors by kind) and the load on NATS (its /varz in_msgs,
# private) and Redis (INFO commandstats calls; the Redis is shared, so
# other runs count too) per second, before the kill or the roll and at the
# busiest 5 s after it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH:/usr/sbin"
MODES="${EK_MODES:-kill roll}"
PHONES="${EK_PHONES:-20000}"
PER_PROCESS="${EK_PER_PROCESS:-7000}"
SOAK="${EK_SOAK:-10s}"
BEFORE="${EK_BEFORE:-20}"
DURATION="${EK_DURATION:-100s}"
RATE="${EK_RATE:-200}"
DELIVER_RATE="${EK_DELIVER_RATE:-50}"
TTL="${EK_TTL:-600}"
ulimit -n "$(ulimit -Hn)"

WORK="$(mktemp -d)"
PIDS=()
LOADTESTS=()
SAMPLER=""
# shellcheck source=loadtest/services.sh
source loadtest/services.sh
REDIS_PREFIX=""
# shellcheck disable=SC2317 # called by the trap, not unreachable
cleanup() {
  if [ -n "$SAMPLER" ]; then kill "$SAMPLER" 2>/dev/null || true; fi
  stop_all "${LOADTESTS[@]}"
  keep_work "${EK_DIR:-}"
}
trap cleanup EXIT

build_binaries
export REDIS_URL=redis://127.0.0.1:6379 MOBILE_ADMIN_LISTEN=127.0.0.1:0

# start_edge I PORT ADMIN_PORT: edge I (log <mode>_edgeI.log, or
# <mode>_edgeI_<n>.log on a restart) with MOBILE_LISTEN 127.0.0.1:PORT (0:
# chosen); sets EDGE_URL_I, EDGE_ADMIN_I and EDGE_PID_I.
start_edge() {
  local i="$1" port="$2" admin="$3" name="${mode}_edge$1"
  if [ -e "$WORK/$name.log" ]; then name="${mode}_edge$1_$SECONDS"; fi
  # shellcheck disable=SC2086 # EK_EDGE_ENV is a list of settings
  start "$name" ${EK_EDGE_ENV:-} MOBILE_TOKEN="$TOKEN" MOBILE_ROUTER=off \
    MOBILE_LISTEN="127.0.0.1:$port" MOBILE_ADMIN_LISTEN="127.0.0.1:$admin" "$WORK/edge"
  eval "EDGE_URL_$i=\"\$(url_of $name 'gateway listening')\""
  eval "EDGE_ADMIN_$i=\"\$(url_of $name 'admin listening')\""
  eval "EDGE_PID_$i=\$PID_$name"
}

# port_of URL: its port.
port_of() { sed -E 's#^[a-z]+://[^:/]+:([0-9]+).*#\1#' <<<"$1"; }

# ready ADMIN: waits up to 30 s until ADMIN/readyz answers 200.
ready() {
  for _ in $(seq 1 300); do
    curl -fsS -o /dev/null "$1/readyz" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "$1/readyz: not ready after 30 s" >&2
  return 1
}

# sample FILE: every second, a line "<unix s> <NATS in_msgs> <Redis calls>"
# (the calls summed over INFO commandstats) until killed.
sample() {
  while :; do
    local nats redis
    nats="$(curl -fsS "$NATS_MON/varz" 2>/dev/null | sed -nE 's/.*"in_msgs": *([0-9]+).*/\1/p' | head -1)"
    redis="$(redis-cli INFO commandstats 2>/dev/null | sed -nE 's/^cmdstat_[^:]*:calls=([0-9]+),.*/\1/p' | awk '{ s += $1 } END { print s + 0 }')"
    echo "$(date +%s) ${nats:-NA} ${redis:-NA}" >>"$1"
    sleep 1
  done
}

# load_report FILE EVENT: NATS messages and Redis calls per second from the
# first sample (the message phase's start) until EVENT (unix s), and over
# the busiest 5 s after it.
load_report() {
  awk -v ev="$2" '
    { t[NR] = $1; n[NR] = $2; r[NR] = $3 }
    END {
      b = 1
      for (i = 1; i <= NR; i++) if (t[i] <= ev) e = i
      if (e > b) printf "before (%d s): NATS %.0f msgs/s, Redis %.0f calls/s\n", t[e] - t[b], (n[e] - n[b]) / (t[e] - t[b]), (r[e] - r[b]) / (t[e] - t[b])
      best = 0
      for (i = e; i + 5 <= NR; i++) {
        d = (n[i + 5] - n[i]) / (t[i + 5] - t[i])
        if (d > best) { best = d; bi = i }
      }
      if (bi) printf "busiest 5 s after (from +%ds): NATS %.0f msgs/s, Redis %.0f calls/s\n", t[bi] - ev, best, (r[bi + 5] - r[bi]) / (t[bi + 5] - t[bi])
    }' "$1"
}

for mode in $MODES; do
  ID="ek$(random | cut -c1-10)"
  TOKEN="$(random)"
  DELIVER_TOKEN="$(random)"
  export REDIS_PREFIX="$ID:" NATS_PREFIX="$ID."
  PIDS=()
  LOADTESTS=()
  start_nats
  for i in 1 2 3; do start_edge "$i" 0 0; done
  start "${mode}_router" MOBILE_ROUTER_LISTEN=127.0.0.1:0 MOBILE_DELIVER_TOKENS="$DELIVER_TOKEN" AGENT=demo "$WORK/router"
  ROUTER="$(url_of "${mode}_router" "router listening")"
  URLS="$EDGE_URL_1,$EDGE_URL_2,$EDGE_URL_3"

  procs=$(((PHONES + PER_PROCESS - 1) / PER_PROCESS))
  echo "== $mode: $PHONES phones from $procs load generator processes on $URLS" >&2
  for i in $(seq 1 "$procs"); do
    n=$((PHONES / procs + (i <= PHONES % procs ? 1 : 0)))
    "$WORK/loadtest" -url "$URLS" -token "$TOKEN" -conns "$n" -soak "$SOAK" -duration "$DURATION" \
      -rate "$(awk -v r="$RATE" -v p="$procs" 'BEGIN { print r / p }')" \
      -deliver "$ROUTER" -deliver-token "$DELIVER_TOKEN" \
      -deliver-rate "$(awk -v r="$DELIVER_RATE" -v p="$procs" 'BEGIN { print r / p }')" -deliver-ttl "$TTL" \
      -reconnect -retry 5m -storm 0 -answer-wait 60s -dial-concurrency 200 -progress 10s \
      -json "$WORK/$mode-$i.json" >"$WORK/$mode-report-$i.txt" 2>"$WORK/$mode-loadtest-$i.log" &
    LOADTESTS+=("$!")
  done
  # The message phase starts when a process logs "held; sending".
  for i in $(seq 1 "$procs"); do
    until grep -q ' held; sending ' "$WORK/$mode-loadtest-$i.log" 2>/dev/null; do
      if ! kill -0 "${LOADTESTS[$((i - 1))]}" 2>/dev/null; then
        echo "load generator $i ended before its message phase:" >&2
        cat "$WORK/$mode-loadtest-$i.log" >&2
        exit 1
      fi
      sleep 0.5
    done
  done
  grep -h ' connected in \| held; sending ' "$WORK/$mode"-loadtest-*.log >&2
  sample "$WORK/$mode-load.txt" &
  SAMPLER=$!
  sleep "$BEFORE"

  event=$(date +%s)
  if [ "$mode" = kill ]; then
    echo "== $(date +%T) SIGKILL edge1 (pid $EDGE_PID_1)" >&2
    kill -KILL "$EDGE_PID_1"
  else
    for i in 1 2 3; do
      eval "pid=\$EDGE_PID_$i url=\$EDGE_URL_$i admin=\$EDGE_ADMIN_$i"
      # shellcheck disable=SC2154 # set by the eval
      echo "== $(date +%T) SIGTERM edge$i (pid $pid)" >&2
      kill -TERM "$pid"
      wait "$pid" || echo "edge$i exited with status $?" >&2
      echo "== $(date +%T) edge$i exited; starting it again" >&2
      start_edge "$i" "$(port_of "$url")" "$(port_of "$admin")"
      ready "$admin"
      echo "== $(date +%T) edge$i ready" >&2
    done
  fi

  status=0
  for pid in "${LOADTESTS[@]}"; do wait "$pid" || status=1; done
  LOADTESTS=()
  kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null || true
  SAMPLER=""
  echo "== $mode: load generators exited $status; merged report:"
  "$WORK/loadtest" merge -json "$WORK/$mode.json" "$WORK/$mode"-[0-9]*.json || true
  echo "== $mode: NATS (private) and Redis (shared) load"
  load_report "$WORK/$mode-load.txt" "$event"
  echo "== $mode: ERROR lines in the servers' logs"
  grep -c '"level":"ERROR"' "$WORK/${mode}"_*.log || true
  stop_all
done

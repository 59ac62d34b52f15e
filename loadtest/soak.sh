#!/usr/bin/env bash
# The soak: a steady load for a long time, watching every process's memory.
# Builds the edge, the router and the load generator (no -race), starts a
# NATS server of its own (so its memory is the gateway's alone), two edges
# (MOBILE_ROUTER=off) and one router (AGENT=demo) on it and on the local
# Redis (127.0.0.1:6379, a key prefix of its own), all with MOBILE_PPROF=on,
# and runs the load generator on them:
#
#   loadtest -url <edge1>,<edge2> -conns SOAK_CONNS -soak 10s -duration SOAK_DURATION
#            -rate SOAK_RATE -deliver <router> -deliver-rate SOAK_DELIVER_RATE -storm 0
#            -metrics … -require-metrics -progress SOAK_SAMPLE -json report.json
#
# From the start of the message phase, every SOAK_SAMPLE (and a few seconds
# before its end, under load) it writes one row
# of rss.csv: the seconds since the start, then the RSS (VmRSS, KiB) of
# edge1, edge2, the router, the NATS server and the load generator, the Go
# heap in use (KiB) and goroutines of edge1, edge2 and the router (their
# /metrics), and Redis's used_memory (KiB; Redis is shared, so only shown).
# At the end of the warm-up (SOAK_WARMUP: a sixth of the duration, at most
# 10 minutes) and at the end it takes a heap profile (after a GC) of each
# Go service: heap-<name>-warm.pprof and heap-<name>-end.pprof, and writes
# `go tool pprof -top -diff_base` of the two into heapdiff-<name>.txt.
#
# Then it prints, per process, the RSS at the end of the warm-up, the
# highest RSS after it and the growth in percent, and the load generator's
# figures. It exits 1 when any server (edge1, edge2, router, NATS) grew by
# more than SOAK_MAX_GROWTH percent (10) after the warm-up, when anything
# was lost or any error was counted, or when a server died; the load
# generator's own growth is shown, not judged.
#
# SOAK_DURATION   message phase sampled (1h; Go-style: 1h, 3m, 90s, 1h30m)
# SOAK_SAMPLE     interval of the samples (1m)
# SOAK_WARMUP     when the baseline is taken (min(10m, SOAK_DURATION/6))
# SOAK_CONNS      phones (2000), split over the two edges
# SOAK_RATE       texts per second, all phones together (100)
# SOAK_DELIVER_RATE  router deliveries per second (20)
# SOAK_MAX_GROWTH percent (10)
# SOAK_DIR        where rss.csv, the profiles, the logs and the report go
#                 (default: a new directory under /tmp, kept and printed)
# EDGE_BIN=<file> ROUTER_BIN=<file> run those binaries instead of building.
#
# On exit it stops every process it started and deletes the Redis keys of
# its prefix.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH:/usr/sbin"

# seconds D: a Go-style duration of hours, minutes and seconds in seconds.
seconds() {
  local d="$1" total=0 n u
  if ! [[ "$d" =~ ^([0-9]+[hms])+$ ]]; then
    echo "not a duration of h, m and s: $d" >&2
    return 1
  fi
  while [[ "$d" =~ ^([0-9]+)([hms])(.*)$ ]]; do
    n="${BASH_REMATCH[1]}" u="${BASH_REMATCH[2]}" d="${BASH_REMATCH[3]}"
    case "$u" in h) total=$((total + n * 3600)) ;; m) total=$((total + n * 60)) ;; s) total=$((total + n)) ;; esac
  done
  echo "$total"
}

DURATION="$(seconds "${SOAK_DURATION:-1h}")"
SAMPLE="$(seconds "${SOAK_SAMPLE:-1m}")"
if [ -n "${SOAK_WARMUP:-}" ]; then
  WARMUP="$(seconds "$SOAK_WARMUP")"
else
  WARMUP=$((DURATION / 6))
  if [ "$WARMUP" -gt 600 ]; then WARMUP=600; fi
fi
CONNS="${SOAK_CONNS:-2000}"
RATE="${SOAK_RATE:-100}"
DELIVER_RATE="${SOAK_DELIVER_RATE:-20}"
MAX_GROWTH="${SOAK_MAX_GROWTH:-10}"
if [ "$SAMPLE" -lt 1 ] || [ "$DURATION" -lt "$SAMPLE" ] || [ "$WARMUP" -ge "$DURATION" ]; then
  echo "SOAK_SAMPLE ($SAMPLE s) must be at least 1 s and at most SOAK_DURATION ($DURATION s); SOAK_WARMUP ($WARMUP s) below it" >&2
  exit 2
fi
# The last sample and the last profiles are taken LAST seconds before the
# message phase ends, under load.
LAST=$((SAMPLE / 2 < 10 ? SAMPLE / 2 : 10))
ulimit -n "$(ulimit -Hn)"

DIR="${SOAK_DIR:-$(mktemp -d /tmp/soak.XXXXXX)}"
mkdir -p "$DIR"
WORK="$DIR"
PIDS=()
# shellcheck source=loadtest/services.sh
source loadtest/services.sh
REDIS_PREFIX=""
LOADTEST_PID=""
# shellcheck disable=SC2317 # called by the trap, not unreachable
cleanup() {
  local loadtest=()
  if [ -n "$LOADTEST_PID" ]; then loadtest=("$LOADTEST_PID"); fi
  stop_all "${loadtest[@]}"
  rm -f "$DIR/edge" "$DIR/router" "$DIR/loadtest"
}
trap cleanup EXIT

build_binaries

ID="sk$(random | cut -c1-10)"
TOKEN="$(random)"
DELIVER_TOKEN="$(random)"
export REDIS_URL=redis://127.0.0.1:6379
export REDIS_PREFIX="$ID:" NATS_PREFIX="$ID."
export MOBILE_ADMIN_LISTEN=127.0.0.1:0 MOBILE_DRAIN_WINDOW=2 MOBILE_PPROF=on

start_nats

start_gateway
declare -A ADMIN
for name in edge1 edge2 router; do
  ADMIN[$name]="$(url_of "$name" "admin listening")"
  ADMIN[$name]="${ADMIN[$name]%/}"
done
GO_PROCS=(edge1 edge2 router)
SERVERS=(edge1 edge2 router nats)
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
  echo "date $(date -u +%FT%TZ)"
  echo "edges $EDGE1 $EDGE2, router $ROUTER, NATS $NATS_URL, REDIS_PREFIX=$REDIS_PREFIX"
  echo "conns $CONNS rate $RATE deliver_rate $DELIVER_RATE duration ${DURATION}s sample ${SAMPLE}s warmup ${WARMUP}s"
} | tee "$DIR/run.txt" >&2

"$DIR/loadtest" -url "$EDGE1,$EDGE2" -token "$TOKEN" -conns "$CONNS" -soak 10s \
  -duration "${DURATION}s" -rate "$RATE" -storm 0 -answer-wait 30s \
  -deliver "$ROUTER" -deliver-token "$DELIVER_TOKEN" -deliver-rate "$DELIVER_RATE" \
  -metrics "edge1=${ADMIN[edge1]}/metrics,edge2=${ADMIN[edge2]}/metrics,router=${ADMIN[router]}/metrics" \
  -require-metrics -progress "${SAMPLE}s" -json "$DIR/report.json" >"$DIR/loadtest.out" 2>"$DIR/loadtest.log" &
LOADTEST_PID=$!

# The message phase starts when the load generator logs "sending".
for _ in $(seq 1 1200); do
  grep -q "messages/s for" "$DIR/loadtest.log" && break
  if ! kill -0 "$LOADTEST_PID" 2>/dev/null; then
    echo "the load generator ended before its message phase:" >&2
    cat "$DIR/loadtest.log" "$DIR/loadtest.out" >&2
    exit 1
  fi
  sleep 0.25
done
T0="$(date +%s.%N)"
echo "$(date +%T) message phase started; sampling every ${SAMPLE}s for ${DURATION}s into $DIR/rss.csv" >&2

pid_of() { if [ "$1" = loadtest ]; then echo "$LOADTEST_PID"; else eval echo "\$PID_$1"; fi; }
# status_kib PID FIELD: a field of /proc/PID/status in KiB (VmRSS, RssAnon).
status_kib() { awk -v k="$2:" '$1 == k { print $2; f = 1 } END { if (!f) print "NA" }' "/proc/$1/status" 2>/dev/null || echo NA; }
# metric FILE NAME: the value of the series NAME (no labels), NA when absent.
metric() { awk -v n="$2" '$1 == n { printf "%.0f\n", $2; f = 1; exit } END { if (!f) print "NA" }' "$1"; }
kib() { if [ "$1" = NA ]; then echo NA; else echo $(($1 / 1024)); fi; }

header="t_s"
for name in edge1 edge2 router nats loadtest; do header+=",${name}_rss_kib"; done
for name in "${GO_PROCS[@]}"; do header+=",${name}_heap_kib,${name}_goroutines"; done
header+=",redis_used_kib"
for name in edge1 edge2 router nats loadtest; do header+=",${name}_anon_kib"; done
echo "$header" >"$DIR/rss.csv"

sample() {
  local t="$1" row name m
  row="$t"
  for name in edge1 edge2 router nats loadtest; do row+=",$(status_kib "$(pid_of "$name")" VmRSS)"; done
  for name in "${GO_PROCS[@]}"; do
    m="$DIR/metrics-$name.txt"
    curl -fsS -m 10 -o "$m" "${ADMIN[$name]}/metrics" 2>/dev/null || : >"$m"
    row+=",$(kib "$(metric "$m" go_memstats_heap_inuse_bytes)"),$(metric "$m" go_goroutines)"
  done
  row+=",$(kib "$(redis-cli INFO memory 2>/dev/null | tr -d '\r' | awk -F: '$1 == "used_memory" { print $2; f = 1 } END { if (!f) print "NA" }')")"
  for name in edge1 edge2 router nats loadtest; do row+=",$(status_kib "$(pid_of "$name")" RssAnon)"; done
  echo "$row" >>"$DIR/rss.csv"
}

profiles() {
  local tag="$1" name
  for name in "${GO_PROCS[@]}"; do
    curl -fsS -m 60 -o "$DIR/heap-$name-$tag.pprof" "${ADMIN[$name]}/debug/pprof/heap?gc=1" ||
      echo "heap profile of $name ($tag) failed" >&2
  done
}

# Every SAMPLE from 0, and LAST seconds before the end.
TIMES=()
for ((t = 0; t < DURATION - LAST; t += SAMPLE)); do TIMES+=("$t"); done
TIMES+=("$((DURATION - LAST))")
warm_taken=""
for t in "${TIMES[@]}"; do
  wait_s="$(awk -v t0="$T0" -v t="$t" -v now="$(date +%s.%N)" 'BEGIN { w = t0 + t - now; print (w > 0 ? w : 0) }')"
  sleep "$wait_s"
  sample "$t"
  if [ -z "$warm_taken" ] && [ "$t" -ge "$WARMUP" ]; then
    profiles warm
    warm_taken="$t"
    echo "$(date +%T) baseline at ${t}s: $(tail -n1 "$DIR/rss.csv")" >&2
  fi
  if ! kill -0 "$LOADTEST_PID" 2>/dev/null; then
    echo "the load generator ended early" >&2
    break
  fi
  echo "$(date +%T) t=${t}s $(tail -n1 "$DIR/rss.csv")" >&2
done
profiles end

status=0
wait "$LOADTEST_PID" || status=$?
LOADTEST_PID=""
for name in "${SERVERS[@]}"; do
  if ! kill -0 "$(pid_of "$name")" 2>/dev/null; then
    echo "$name died during the soak; its log:" >&2
    tail -n 40 "$DIR/$name.log" >&2
    status=1
  fi
done

for name in "${GO_PROCS[@]}"; do
  if [ -s "$DIR/heap-$name-warm.pprof" ] && [ -s "$DIR/heap-$name-end.pprof" ]; then
    go tool pprof -top -diff_base "$DIR/heap-$name-warm.pprof" "$DIR/heap-$name-end.pprof" >"$DIR/heapdiff-$name.txt" 2>&1 || true
  fi
done

# The summary: growth after the warm-up of every process's RSS.
{
  echo "== RSS (MiB) after the warm-up (${warm_taken:-?}s): at its end, highest after it, at the end, growth; then the same of its anonymous part (RssAnon: heap, stacks; the rest is the binary's pages)"
  awk -F, -v warm="${warm_taken:-0}" -v maxg="$MAX_GROWTH" '
    NR == 1 {
      for (i = 2; i <= NF; i++) {
        n = $i
        if (sub(/_rss_kib$/, "", n)) { col[i] = n; order[++k] = i }
        else if (sub(/_anon_kib$/, "", n)) anon[n] = i
      }
      next
    }
    $1 == warm { for (i = 2; i <= NF; i++) base[i] = $i }
    $1 >= warm { for (i = 2; i <= NF; i++) { if ($i != "NA" && $i + 0 > top[i] + 0) top[i] = $i; last[i] = $i } }
    END {
      bad = 0
      for (j = 1; j <= k; j++) {
        i = order[j]
        judged = (col[i] != "loadtest")
        g = base[i] > 0 ? 100 * (top[i] - base[i]) / base[i] : 0
        verdict = judged ? (g > maxg ? "FAIL" : "ok") : "(not judged: the load generator)"
        if (judged && g > maxg) bad = 1
        a = anon[col[i]]
        ga = base[a] > 0 ? 100 * (top[a] - base[a]) / base[a] : 0
        printf "%-9s %8.1f %8.1f %8.1f %+6.1f%%  anon %6.1f %6.1f %6.1f %+6.1f%%  %s\n", col[i], base[i] / 1024, top[i] / 1024, last[i] / 1024, g,
          base[a] / 1024, top[a] / 1024, last[a] / 1024, ga, verdict
      }
      exit bad
    }' "$DIR/rss.csv" || status=1
  if [ -s "$DIR/report.json" ]; then
    echo "== load generator"
    jq -r '"texts sent \(.messages.sent) answered \(.messages.answered) lost \(.messages.lost) at \(.messages.sent_per_s | floor)/s, p50 \(.messages.latency.p50_ms // "?") ms p99 \(.messages.latency.p99_ms // "?") ms",
           "deliveries sent \(.deliveries.sent) received \(.deliveries.received) lost \(.deliveries.lost)",
           "connections held at the end \(.held_at_end) of \(.connect.wanted); errors \(.errors // {} | tostring)",
           "verdict: \(if .ok then "ok" else "FAILED \(.failures)" end)"' "$DIR/report.json"
    lost="$(jq '.messages.lost + .deliveries.lost + ((.errors // {}) | add // 0)' "$DIR/report.json")"
    if [ "$lost" != 0 ]; then status=1; fi
  else
    echo "no report from the load generator"
    status=1
  fi
  for name in "${GO_PROCS[@]}"; do
    if [ -s "$DIR/heapdiff-$name.txt" ]; then
      echo "== $name: heap in use, end minus warm-up (top 8)"
      sed -n '/flat%/,$p' "$DIR/heapdiff-$name.txt" | head -n 9
    fi
  done
} >"$DIR/summary.txt"
echo "files in $DIR; soak $([ "$status" = 0 ] && echo passed || echo FAILED)" >>"$DIR/summary.txt"
cat "$DIR/summary.txt"
exit "$status"

#!/usr/bin/env bash
# Memory per idle authenticated phone on ONE edge in cluster mode, counting
# the edge, the NATS server and Redis together. Builds the edge, the router
# and the load generator (no -race), starts a NATS server of its own
# (nats-server -a 127.0.0.1 -p -1 -m -1: ports chosen by the server, no
# JetStream; the gateway uses none), so that the NATS server's memory is the
# gateway's alone, one edge (MOBILE_ROUTER=off, MOBILE_PPROF=on) and one
# router (AGENT=demo) on it and on the local Redis (127.0.0.1:6379) with a
# key prefix of its own, with the open-file limit raised to the hard limit.
#
# It reads the figures with no phone, connects MEM_PHONES phones (19,500)
# from several load generator processes (MEM_PER_PROCESS, 6,500 each, at
# most 9,000) that hold them idle (-rate 0 -duration 0s -storm 0), waits
# until every process reports its phones connected (hello → ready) and the
# edge's hermes_connections is MEM_PHONES, reads the figures again, checks
# that every phone was still connected, and prints the cost per phone:
#
#   edge RSS          process_resident_memory_bytes of /metrics
#   edge Go heap      go_memstats_heap_inuse_bytes (part of the edge's RSS)
#   NATS server RSS   VmRSS of /proc/<pid>/status (and /varz mem)
#   Redis             MEMORY USAGE of a sample of the run's keys of each
#                     kind, times the number of keys of that kind (SCAN on
#                     the prefix); Redis is shared, so INFO used_memory is
#                     only shown
#
# Each reading first forces two GCs in the edge (/debug/pprof/heap?gc=1
# twice, so that what sync.Pools held is freed; the second profile is kept
# as heap-before.pprof and heap-after.pprof) and reads /metrics after them.
# The script prints the heap profile's top entries with the phones, and the
# difference between both profiles.
#
# MEM_PHONES=<n>       phones (default 19500)
# MEM_PER_PROCESS=<n>  phones per load generator process (default 6500)
# MEM_WAIT=<s>         how long the phones may take to connect (default 300)
# MEM_SAMPLE=<n>       keys of each kind whose MEMORY USAGE is read (200)
# MEM_DIR=<dir>        keeps the logs, /metrics, /varz, heap profiles and
#                      the loadtest reports
# MEM_PROFILE_RATE=<n> runs the edge with GODEBUG=memprofilerate=<n> (1:
#                      every allocation) for a heap profile that is not
#                      sampled; the profiling then costs memory of its own,
#                      so such a run's figures are not the edge's usual ones
# EDGE_BIN=<file> ROUTER_BIN=<file> run those binaries instead of building
# the edge and the router (e.g. an earlier commit's).
#
# It exits 0 when every phone connected and was held through the readings,
# 1 otherwise. On exit it stops every process it started and deletes the
# Redis keys of its prefix.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH:/usr/sbin"

PHONES="${MEM_PHONES:-19500}"
PER_PROCESS="${MEM_PER_PROCESS:-6500}"
WAIT="${MEM_WAIT:-300}"
SAMPLE="${MEM_SAMPLE:-200}"
if [ "$PER_PROCESS" -gt 9000 ]; then
  echo "MEM_PER_PROCESS: at most 9000 connections per load generator process" >&2
  exit 2
fi
ulimit -n "$(ulimit -Hn)"

WORK="$(mktemp -d)"
PIDS=()
# shellcheck source=loadtest/services.sh
source loadtest/services.sh
LOADTESTS=()
REDIS_PREFIX=""
# shellcheck disable=SC2317 # called by the trap, not unreachable
cleanup() {
  stop_all "${LOADTESTS[@]}"
  keep_work "${MEM_DIR:-}"
}
trap cleanup EXIT

build_binaries

ID="mm$(random | cut -c1-10)"
TOKEN="$(random)"
export REDIS_URL=redis://127.0.0.1:6379
export REDIS_PREFIX="$ID:" NATS_PREFIX="$ID."
export MOBILE_ADMIN_LISTEN=127.0.0.1:0 MOBILE_DRAIN_WINDOW=2

start_nats

EDGE_ENV=()
if [ -n "${MEM_PROFILE_RATE:-}" ]; then EDGE_ENV+=("GODEBUG=memprofilerate=$MEM_PROFILE_RATE"); fi
start edge "${EDGE_ENV[@]}" MOBILE_TOKEN="$TOKEN" MOBILE_ROUTER=off MOBILE_LISTEN=127.0.0.1:0 MOBILE_PPROF=on "$WORK/edge"
start router MOBILE_ROUTER_LISTEN=127.0.0.1:0 AGENT=demo "$WORK/router"
EDGE="$(url_of edge "gateway listening")"
ADMIN="$(url_of edge "admin listening")"
url_of router "router listening" >/dev/null
# shellcheck disable=SC2154 # PID_edge is set by start
echo "edge $EDGE (admin $ADMIN, pid $PID_edge, open files $(ulimit -n)), NATS $NATS_URL (monitor $NATS_MON, pid $PID_nats), REDIS_PREFIX=$REDIS_PREFIX" >&2

# redis_kinds TAG: from keys-TAG.txt (the run's keys) writes kinds-TAG.txt,
# one line per kind of key (the name up to the device's {…}): kind, keys,
# keys sampled, mean MEMORY USAGE of the sample, keys × mean.
redis_kinds() {
  local tag="$1"
  awk -v p="$REDIS_PREFIX" -v s="$SAMPLE" '{
      k = substr($0, length(p) + 1); i = index(k, "{")
      kind = (i > 1) ? substr(k, 1, i - 1) : k
      if (n[kind]++ < s) print kind, $0
    }' "$WORK/keys-$tag.txt" >"$WORK/sample-$tag.txt"
  awk '{ print "MEMORY USAGE", $2 }' "$WORK/sample-$tag.txt" | redis-cli >"$WORK/usage-$tag.txt"
  paste -d' ' "$WORK/sample-$tag.txt" "$WORK/usage-$tag.txt" |
    awk -v p="$REDIS_PREFIX" -v keys="$WORK/keys-$tag.txt" '
      $3 ~ /^[0-9]+$/ { sum[$1] += $3; got[$1]++ }
      END {
        while ((getline line < keys) > 0) {
          k = substr(line, length(p) + 1); i = index(k, "{")
          kind = (i > 1) ? substr(k, 1, i - 1) : k
          n[kind]++
        }
        for (kind in n) {
          mean = got[kind] ? sum[kind] / got[kind] : 0
          printf "%s %d %d %.1f %.0f\n", kind, n[kind], got[kind], mean, n[kind] * mean
        }
      }' | sort >"$WORK/kinds-$tag.txt"
}

declare -A V
# reading TAG: forces a GC in the edge and reads every figure into V[TAG.*].
reading() {
  local tag="$1"
  # Two GCs: the first moves what sync.Pools hold to their victim caches,
  # the second frees it, so pooled buffers of the handshakes are not counted.
  curl -fsS -o /dev/null "$ADMIN/debug/pprof/heap?gc=1"
  curl -fsS -o "$WORK/heap-$tag.pprof" "$ADMIN/debug/pprof/heap?gc=1"
  curl -fsS -o "$WORK/metrics-$tag.txt" "$ADMIN/metrics"
  curl -fsS -o "$WORK/varz-$tag.json" "$NATS_MON/varz"
  redis-cli INFO memory | tr -d '\r' >"$WORK/redis-$tag.txt"
  redis-cli --scan --pattern "${REDIS_PREFIX}*" >"$WORK/keys-$tag.txt"
  redis_kinds "$tag"
  local m="$WORK/metrics-$tag.txt"
  V[$tag.edge_rss]="$(metric "$m" process_resident_memory_bytes)"
  V[$tag.edge_heap]="$(metric "$m" go_memstats_heap_inuse_bytes)"
  V[$tag.edge_heap_alloc]="$(metric "$m" go_memstats_heap_alloc_bytes)"
  V[$tag.edge_heap_idle]="$(metric "$m" go_memstats_heap_idle_bytes)"
  V[$tag.edge_heap_released]="$(metric "$m" go_memstats_heap_released_bytes)"
  V[$tag.edge_stack]="$(metric "$m" go_memstats_stack_inuse_bytes)"
  V[$tag.edge_sys]="$(metric "$m" go_memstats_sys_bytes)"
  V[$tag.edge_goroutines]="$(metric "$m" go_goroutines)"
  V[$tag.edge_conns]="$(metric "$m" hermes_connections)"
  V[$tag.nats_rss]="$(awk '/^VmRSS:/ { print $2 * 1024 }' "/proc/$PID_nats/status")"
  V[$tag.nats_varz_mem]="$(sed -nE 's/.*"mem": *([0-9]+).*/\1/p' "$WORK/varz-$tag.json" | head -n1)"
  V[$tag.nats_subs]="$(sed -nE 's/.*"subscriptions": *([0-9]+).*/\1/p' "$WORK/varz-$tag.json" | head -n1)"
  V[$tag.redis_used]="$(sed -n 's/^used_memory://p' "$WORK/redis-$tag.txt")"
  V[$tag.redis_keys]="$(wc -l <"$WORK/keys-$tag.txt" | tr -d ' ')"
  V[$tag.redis_est]="$(awk '{ s += $5 } END { printf "%.0f\n", s }' "$WORK/kinds-$tag.txt")"
}

echo "== reading with no phone" >&2
reading before

started=$SECONDS
connect_phones "$EDGE" "$PHONES" "$PER_PROCESS" "$WAIT" "$ADMIN"
echo "$PHONES phones connected in $((SECONDS - started))s" >&2

echo "== reading with $PHONES phones" >&2
reading after
status=0
if [ "${V[after.edge_conns]}" != "$PHONES" ]; then
  echo "the edge counted ${V[after.edge_conns]} connections during the reading, not $PHONES" >&2
  status=1
fi

# The readings are taken: end the soak (SIGTERM ends it early; the load
# generator then closes its connections with 1000 and judges the run).
for pid in "${LOADTESTS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
for i in $(seq 1 "$procs"); do
  if ! wait "${LOADTESTS[$((i - 1))]}"; then
    echo "load generator $i failed; its log:" >&2
    tail -n 30 "$WORK/loadtest-$i.log" >&2
    status=1
  fi
done
LOADTESTS=()
all_alive nats edge router || status=1

# ---- report ----
delta() {
  local a="${V[after.$1]}" b="${V[before.$1]}"
  if [[ $a =~ ^[0-9]+$ && $b =~ ^[0-9]+$ ]]; then echo $((a - b)); else echo NA; fi
}
row() { # label key
  printf '  %-34s %14s %14s %14s\n' "$1" "${V[before.$2]}" "${V[after.$2]}" "$(delta "$2")"
}
per() { # label bytes
  awk -v l="$1" -v b="$2" -v n="$PHONES" 'BEGIN {
    if (b !~ /^-?[0-9]+$/) printf "  %-48s %10s\n", l, "n/a"
    else printf "  %-48s %8.0f B %8.2f KiB\n", l, b / n, b / n / 1024
  }'
}

echo
echo "Raw figures, $PHONES phones on one edge (bytes unless named):"
printf '  %-34s %14s %14s %14s\n' "" "no phone" "$PHONES phones" "difference"
row "edge process_resident_memory_bytes" edge_rss
row "edge go_memstats_heap_inuse_bytes" edge_heap
row "edge go_memstats_heap_alloc_bytes" edge_heap_alloc
row "edge go_memstats_heap_idle_bytes" edge_heap_idle
row "edge go_memstats_heap_released_bytes" edge_heap_released
row "edge go_memstats_stack_inuse_bytes" edge_stack
row "edge go_memstats_sys_bytes" edge_sys
row "edge go_goroutines" edge_goroutines
row "edge hermes_connections" edge_conns
row "NATS server VmRSS" nats_rss
row "NATS server /varz mem" nats_varz_mem
row "NATS server /varz subscriptions" nats_subs
row "Redis used_memory (shared)" redis_used
row "Redis keys of the run" redis_keys
row "Redis MEMORY USAGE of the run" redis_est
echo
echo "Redis keys of the run with $PHONES phones (kind, keys, sampled, mean MEMORY USAGE, keys × mean):"
sed 's/^/  /' "$WORK/kinds-after.txt"
echo
echo "Heap profile of the edge with $PHONES phones (inuse_space, after a GC):"
go tool pprof -sample_index=inuse_space -top -nodecount=15 "$WORK/edge" "$WORK/heap-after.pprof" 2>&1 | sed -E '/^(File|Build ID|Type|Time):/d; s/^/  /' || true
echo
echo "The same, minus the profile with no phone:"
go tool pprof -sample_index=inuse_space -top -nodecount=15 -diff_base "$WORK/heap-before.pprof" "$WORK/edge" "$WORK/heap-after.pprof" 2>&1 | sed -E '/^(File|Build ID|Type|Time):/d; s/^/  /' || true

edge_rss=$(delta edge_rss)
edge_heap=$(delta edge_heap)
nats_rss=$(delta nats_rss)
redis_est=$(delta redis_est)
total=NA total_heap=NA
if [[ "$edge_rss $edge_heap $nats_rss $redis_est" =~ ^-?[0-9]+\ -?[0-9]+\ -?[0-9]+\ -?[0-9]+$ ]]; then
  total=$((edge_rss + nats_rss + redis_est))
  total_heap=$((edge_heap + nats_rss + redis_est))
fi
echo
echo "Per idle authenticated phone ($PHONES phones, one edge, cluster mode):"
per "edge RSS" "$edge_rss"
per "  of which Go heap in use" "$edge_heap"
per "NATS server RSS" "$nats_rss"
per "Redis (MEMORY USAGE of the run's keys)" "$redis_est"
per "total: edge RSS + NATS RSS + Redis" "$total"
per "(the same with the edge's Go heap, not its RSS)" "$total_heap"
per "(Redis used_memory, shared, for reference)" "$(delta redis_used)"
per "(NATS server /varz mem, for reference)" "$(delta nats_varz_mem)"
awk -v b="$total" -v n="$PHONES" 'BEGIN { if (b ~ /^-?[0-9]+$/) printf "  target 3 KiB (3,072 B): %.2f× the target\n", b / n / 3072 }'
exit "$status"

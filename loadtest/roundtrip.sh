#!/usr/bin/env bash
# The round trip's p99 measured the ways the load generator can, back to
# back on one cluster: builds the edge, the router and the load generator
# (no -race), starts two edges (MOBILE_ROUTER=off) and one router
# (AGENT=demo) on the local Redis (127.0.0.1:6379) and NATS (127.0.0.1:4222)
# with prefixes of their own, as step.sh does, then runs in turn, each at
# RT_RATE texts/s (1000) in all:
#
#   step     loadtest step -scenario roundtrip -floor off -rates RT_RATE
#            -step RT_STEP (10s), after steps of RT_WARM (100,200,500/s)
#            as step.sh's default sweep does (no step stops the sweep here:
#            -p99-max 5s -min-achieved 0.01, so RT_RATE always runs):
#            RT_STEP_PHONES (200, as step.sh) phones, one pacer,
#            each text timed from its write (step.sh's figure)
#   central  loadtest -pace central -conns RT_PHONES (500) -duration
#            RT_DURATION (30s): one pacer, round-robin, timed from the write
#   phone    loadtest -pace phone -conns RT_PHONES: every phone on a timer
#            of its own at RT_RATE/RT_PHONES a second from a random phase,
#            timed from when the text was due (and from its write)
#
# all with the phones split over both edges, and RT_ROUNDS (1) times over.
# For each it counts the cores used by every process on the path over the
# run (services, load generator, Redis, NATS), by the rest of the machine
# (other work on it) and the load average, and at
# the end prints one line per run: p50, p99, p99.9, max, and for the phone
# pace the same from the write and how late the writes were.
#
# RT_DIR=<dir> keeps the reports (JSON), the cores and the logs.
# RT_MODES (step,central,phone) chooses and orders the runs; stepN is step
# mode with N phones (step500).
# EDGE_BIN=<file> ROUTER_BIN=<file> run those binaries instead of building.
# RT_PROFILE=<seconds> takes a CPU profile of the edges and the router
# (their admin ports' /debug/pprof/profile) over that many seconds from the
# start of each run, kept in RT_DIR as <run>.<process>.pprof (read with
# `go tool pprof -top <binary> <file>`; the binaries are kept beside them).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH:/usr/sbin"

RATE="${RT_RATE:-1000}"
PHONES="${RT_PHONES:-500}"
DURATION="${RT_DURATION:-30s}"
STEP="${RT_STEP:-10s}"
WARM="${RT_WARM:-100,200,500}"
STEP_PHONES="${RT_STEP_PHONES:-200}"
ROUNDS="${RT_ROUNDS:-1}"
MODES="${RT_MODES:-step,central,phone}"
ulimit -n "$(ulimit -Hn)"

WORK="$(mktemp -d)"
DIR="${RT_DIR:-$WORK/out}"
mkdir -p "$DIR"
PIDS=()
# shellcheck source=loadtest/services.sh
source loadtest/services.sh
REDIS_PREFIX=""
# shellcheck disable=SC2317 # called by the trap, not unreachable
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  cp "$WORK"/*.log "$DIR"/ 2>/dev/null || true
  if [ -n "$REDIS_PREFIX" ]; then
    redis-cli --scan --pattern "${REDIS_PREFIX}*" | xargs -r -n 1000 redis-cli UNLINK >/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

build_binaries

ID="rt$(random | cut -c1-10)"
TOKEN="$(random)"
DELIVER_TOKEN="$(random)"
export NATS_URL=nats://127.0.0.1:4222 REDIS_URL=redis://127.0.0.1:6379
export REDIS_PREFIX="$ID:" NATS_PREFIX="$ID."
export MOBILE_ADMIN_LISTEN=127.0.0.1:0 MOBILE_DRAIN_WINDOW=2 MOBILE_PPROF=on

start_gateway
EDGES="$EDGE1,$EDGE2"
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
  echo "date $(date -u +%FT%TZ), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "edges $EDGES (REDIS_PREFIX=$REDIS_PREFIX NATS_PREFIX=$NATS_PREFIX)"
} | tee "$DIR/run.txt" >&2

# listener PORT: the pid of the process listening on 127.0.0.1:PORT.
listener() { ss -Hltnp "sport = :$1" | sed -nE 's/.*pid=([0-9]+).*/\1/p' | head -n1; }
PID_nats="$(listener 4222)" PID_redis="$(listener 6379)"

# cpu_times: "name ticks" of every process on the path of a round trip
# and of the machine as a whole (every core's busy ticks, from /proc/stat).
# children_ticks FILE: the ticks of this shell's children that have ended
# (the load generator's), from the output of bash's times in FILE.
children_ticks() {
  awk -v hz="$(getconf CLK_TCK)" 'NR == 2 {
      split($1, u, /[ms]/); split($2, s, /[ms]/)
      printf "loadtest %.0f\n", (u[1] * 60 + u[2] + s[1] * 60 + s[2]) * hz }' "$1"
}
cpu_times() {
  local name
  ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
  for name in edge1 edge2 router nats redis; do echo "$name $(ticks "$(eval echo "\$PID_$name")")"; done
  awk '$1 == "cpu" { print "machine", $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat
}
# cores BEFORE AFTER SECONDS: one line, the cores each process used, and
# what the rest of the machine used meanwhile (other work on it).
cores() {
  paste -d' ' <(echo "$1") <(echo "$2") |
    awk -v hz="$(getconf CLK_TCK)" -v t="$3" '$1 == $3 { n[$1] = ($4 - $2) / hz / t }
      END {
        for (k in n) if (k != "machine") { printf "%s %.2f, ", k, n[k]; s += n[k] }
        printf "path %.2f, rest of the machine %.2f", s, n["machine"] - s
      }'
}

# measure TAG COMMAND...: runs the command, counting the cores over it.
measure() {
  local tag="$1" before t0 t1 st=0
  shift
  times >"$WORK/times0" # in this shell: its children's times so far
  before="$(cpu_times; children_ticks "$WORK/times0")" t0="$(date +%s.%N)"
  profile "$tag"
  "$@" >"$DIR/$tag.out" 2>"$DIR/$tag.err" || st=$?
  wait_profiles
  t1="$(date +%s.%N)"
  times >"$WORK/times1"
  echo "$tag: cores $(cores "$before" "$(cpu_times; children_ticks "$WORK/times1")" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')") of $(nproc); load average $(cut -d' ' -f1 /proc/loadavg); exit $st" |
    tee "$DIR/$tag.cores" >&2
}

# profile TAG: with RT_PROFILE, a CPU profile of each edge and the router
# in the background (PROFILERS), over RT_PROFILE seconds.
PROFILERS=()
profile() {
  [ -n "${RT_PROFILE:-}" ] || return 0
  local name admin
  for name in edge1 edge2 router; do
    admin="$(url_of "$name" "admin listening")"
    curl -sf -o "$DIR/$1.$name.pprof" "$admin/debug/pprof/profile?seconds=$RT_PROFILE" &
    PROFILERS+=("$!")
  done
}
wait_profiles() {
  local pid
  for pid in "${PROFILERS[@]}"; do wait "$pid" || echo "a profile failed" >&2; done
  PROFILERS=()
}
if [ -n "${RT_PROFILE:-}" ]; then cp "$WORK/edge" "$WORK/router" "$DIR"/; fi

for round in $(seq 1 "$ROUNDS"); do
  for mode in ${MODES//,/ }; do
    tag="$mode-$round"
    echo "$(date +%T) $tag" >&2
    case "$mode" in
      step*)
        n="${mode#step}"
        measure "$tag" "$WORK/loadtest" step -scenario roundtrip -floor off -url "$EDGES" -token "$TOKEN" \
          -phones "${n:-$STEP_PHONES}" -rates "$WARM,$RATE" -step "$STEP" -p99-max 5s -min-achieved 0.01 -json "$DIR/$tag.json" ;;
      central | phone)
        measure "$tag" "$WORK/loadtest" -pace "$mode" -url "$EDGES" -token "$TOKEN" -conns "$PHONES" \
          -soak 2s -duration "$DURATION" -rate "$RATE" -storm 0 -json "$DIR/$tag.json" ;;
      *) echo "RT_MODES: unknown $mode" >&2; exit 2 ;;
    esac
  done
done

echo "== round trips at $RATE/s: p50 / p99 / p99.9 / max ms"
for round in $(seq 1 "$ROUNDS"); do
  for mode in ${MODES//,/ }; do
    f="$DIR/$mode-$round.json"
    [ -s "$f" ] || { echo "$mode-$round: no report"; continue; }
    if [[ "$mode" == step* ]]; then
      jq -r --arg t "$mode-$round" --argjson r "$RATE" '.settings.phones as $p | .scenarios[] | .gateway.steps[] | select(.offered_per_s == $r) |
        "\($t) (\($p) phones, step mode, from the write): achieved \(.achieved_per_s | floor)/s, \(.latency.p50_ms*10|round/10) / \(.p99_ms*10|round/10) / \(.latency.p999_ms*10|round/10) / \(.latency.max_ms*10|round/10), missed \(.missed), load \(.load1)"' "$f"
    else
      jq -r --arg t "$mode-$round" '. as $x | .messages as $m |
        def l(h): "\(h.p50_ms*10|round/10) / \(h.p99_ms*10|round/10) / \(h.p999_ms*10|round/10) / \(h.max_ms*10|round/10)";
        "\($t) (\($x.settings.conns) phones, \($x.settings.pace), from \(if $x.settings.pace == "phone" then "due" else "the write" end)): sent \($m.sent) answered \($m.answered) lost \($m.lost) at \($m.sent_per_s|floor)/s, \(l($m.latency))"
        + (if $x.settings.pace == "phone" then "; from the write \(l($m.latency_from_write)); write late \(l($m.write_lag))" else "" end)
        + (($m.in_flight_at_send // []) as $c | ($c | add // 0) as $n | if $n > 0 then
            "; sent with the phone waiting for 1+ answers: \(1000 * ($n - $c[0]) / $n | round / 10)%, 2+: \(1000 * ($n - $c[0] - ($c[1] // 0)) / $n | round / 10)%" else "" end)' "$f"
    fi
    cat "$DIR/$mode-$round.cores"
  done
done | tee "$DIR/summary.txt"

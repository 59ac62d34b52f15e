#!/usr/bin/env bash
# Fairness between owners: what one owner's flood does to another owner's
# phones on the same edge and router. One edge and one router in cluster
# mode (a NATS of its own, the local Redis with a prefix of its own) read
# a tenants file of two owners, alpha (the flood, with the default quotas)
# and bravo (the phones measured, its connections quota above its
# phones). It runs bravo's phones twice, the same way: alone, then while
# alpha floods, and prints bravo's hello → ready and answer latencies of
# both runs and their ratio.
#
#   bravo: FAIR_PHONES (2,000) phones connect, hold 2 s, send 200 texts a
#          second for 10 s, a quarter reconnect at once; before the runs,
#          a cron delivery with a ttl to bravo's sleeping device "sleeper",
#          which must still be in its outbox at the end.
#   alpha: FAIR_FLOOD_PHONES (6,000) phones connect at once (1,000 in
#          flight) and send FAIR_FLOOD_RATE (2,000) texts a second for
#          30 s, then all reconnect at once; beside them, deliveries of
#          10,000 characters with a ttl to 1,000 made-up devices at 500 a
#          second (loadtest flood).
#
# FAIR_DIR=<dir> keeps the logs and the JSON reports.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH:/usr/sbin"
PHONES="${FAIR_PHONES:-2000}"
FLOOD_PHONES="${FAIR_FLOOD_PHONES:-6000}"
FLOOD_RATE="${FAIR_FLOOD_RATE:-2000}"
ulimit -n "$(ulimit -Hn)"

WORK="$(mktemp -d)"
PIDS=()
# shellcheck source=loadtest/services.sh
source loadtest/services.sh
REDIS_PREFIX=""
# shellcheck disable=SC2317 # called by the trap, not unreachable
cleanup() {
  stop_all
  keep_work "${FAIR_DIR:-}"
}
trap cleanup EXIT

build_binaries
ID="fa$(random | cut -c1-10)"
export REDIS_URL=redis://127.0.0.1:6379
export REDIS_PREFIX="$ID:" NATS_PREFIX="$ID."
export MOBILE_ADMIN_LISTEN=127.0.0.1:0
declare -A KEY
{
  echo "tenants:"
  for o in alpha bravo; do
    KEY[$o.app]="$(random)" KEY[$o.cron]="$(random)"
    echo "  - id: $o"
    echo "    keys:"
    echo "      - {id: app, kind: app, secret: \"${KEY[$o.app]}\"}"
    echo "      - {id: cron, kind: deliver, secret: \"${KEY[$o.cron]}\"}"
  done
  # bravo's quota holds all its phones; alpha keeps the defaults (1,000
  # sockets, 1,000 deliveries a second, 64 MiB of outbox).
  echo "    quota: {connections: $((PHONES * 2))}"
} >"$WORK/tenants.yaml"
key() { echo "hmt_$1.$2.${KEY[$1.$2]}"; }
export MOBILE_TENANTS_FILE="$WORK/tenants.yaml"

start_nats
start edge MOBILE_ROUTER=off MOBILE_LISTEN=127.0.0.1:0 "$WORK/edge"
start router MOBILE_ROUTER_LISTEN=127.0.0.1:0 AGENT=demo "$WORK/router"
EDGE="$(url_of edge "gateway listening")"
ROUTER="$(url_of router "router listening")"

# bravo's kept cron message, for its sleeping phone.
kept="$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $(key bravo cron)" \
  -d '{"target":"sleeper","id":"kept-1","text":"kept for the sleeper","ttl":3600}' "$ROUTER/v1/deliver")"
[ "$kept" = 202 ] || { echo "bravo's delivery to its sleeping phone: $kept, want 202" >&2; exit 1; }

bravo() { # bravo NAME: bravo's phones' run, its report in $WORK/NAME.json
  "$WORK/loadtest" -url "$EDGE" -token "$(key bravo app)" -conns "$PHONES" -soak 2s -duration 10s -rate 200 \
    -storm 0.25 -run "b$1" -json "$WORK/$1.json" >"$WORK/$1.txt" 2>"$WORK/$1.log" || true
}

echo "== bravo alone" >&2
bravo alone

echo "== bravo while alpha floods" >&2
"$WORK/loadtest" -url "$EDGE" -token "$(key alpha app)" -conns "$FLOOD_PHONES" -dial-concurrency 1000 -soak 0s \
  -duration 30s -rate "$FLOOD_RATE" -storm 1 -answer-wait 5s -run alpha -json "$WORK/alpha.json" \
  >"$WORK/alpha.txt" 2>"$WORK/alpha.log" &
ALPHA=$!
"$WORK/loadtest" flood -deliver "$ROUTER" -deliver-token "$(key alpha cron)" -devices 1000 -rate 500 \
  -bytes 10000 -duration 40s -run alpha >"$WORK/flood.txt" 2>&1 &
FLOOD=$!
# bravo starts once alpha's phones are connecting.
for _ in $(seq 1 300); do grep -q 'connecting\|connected' "$WORK/alpha.log" 2>/dev/null && break; sleep 0.1; done
bravo flooded
wait "$ALPHA" || true
wait "$FLOOD" || true

sleeper="$(redis-cli LLEN "${REDIS_PREFIX}outbox:{$(printf '\xef\xb7\x90')bravo:sleeper}")"

echo
echo "alpha: $(grep -m1 -E '^connections' "$WORK/alpha.txt" || true)"
cat "$WORK/flood.txt"
echo "bravo's sleeping phone: $sleeper item(s) kept (want 1)"
python3 - "$WORK/alone.json" "$WORK/flooded.json" <<'EOF'
import json, sys
a, f = (json.load(open(p)) for p in sys.argv[1:3])
def row(name, get):
    x, y = get(a), get(f)
    ratio = f"{y / x:.2f}" if x else "-"
    print(f"| {name} | {x:.1f} | {y:.1f} | {ratio} |")
print("| bravo | alone | while alpha floods | ratio |")
print("|---|---:|---:|---:|")
row("connected", lambda r: r["connect"]["held"])
row("hello → ready p50 (ms)", lambda r: r["connect"]["handshake"]["p50_ms"])
row("hello → ready p99 (ms)", lambda r: r["connect"]["handshake"]["p99_ms"])
row("texts lost", lambda r: r["messages"]["lost"])
row("answer p99 (ms)", lambda r: r["messages"]["latency"]["p99_ms"])
row("storm: back", lambda r: r["storm"]["back"])
row("storm: hello → ready p99 (ms)", lambda r: r["storm"]["handshake"]["p99_ms"])
EOF

#!/usr/bin/env bash
# A reconnect storm on ONE edge in cluster mode: STORM_PHONES phones
# (9,000) connect and are held, then all are dropped at once, without a
# close frame, as when their edge died, and come back at once
# (-storm 1, -dial-concurrency 1000), each then sending one text that the
# demo agent must answer. It runs the storm twice on the same edge: first
# with phones that make one attempt (-retry 0: what failed stays failed),
# then with phones that retry as the SDKs do (-retry 60s: a 503's
# Retry-After, full jitter). Builds the edge, the router and the load
# generator (no -race), starts a NATS server of its own and uses the local
# Redis (127.0.0.1:6379) with a key prefix of its own.
#
# STORM_PHONES=<n>  phones (default 9000, at most 9000: one process)
# STORM_EDGE_ENV="VAR=value …"  more settings of the edge, e.g.
#                   "MOBILE_MAX_HELLO_MIB=1024 MOBILE_MAX_HELLO_CONNS=100000"
#                   to run without shedding
# EDGE_BIN=<file> ROUTER_BIN=<file> run those binaries (an earlier commit's)
# STORM_DIR=<dir>   keeps the logs and the JSON reports
#
# It prints the load generator's report of each run: the phones back and
# the seconds until the last was back, the storm's handshakes (first
# attempt to ready, p50/p99), the texts answered, and the errors by kind
# (dial:http 503, error:internal_error, retried, …).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH:/usr/sbin"
PHONES="${STORM_PHONES:-9000}"
ulimit -n "$(ulimit -Hn)"

WORK="$(mktemp -d)"
PIDS=()
# shellcheck source=loadtest/services.sh
source loadtest/services.sh
REDIS_PREFIX=""
# shellcheck disable=SC2317 # called by the trap, not unreachable
cleanup() {
  stop_all
  keep_work "${STORM_DIR:-}"
}
trap cleanup EXIT

build_binaries
ID="st$(random | cut -c1-10)"
TOKEN="$(random)"
export REDIS_URL=redis://127.0.0.1:6379
export REDIS_PREFIX="$ID:" NATS_PREFIX="$ID."
export MOBILE_ADMIN_LISTEN=127.0.0.1:0 MOBILE_DRAIN_WINDOW=2
start_nats
# shellcheck disable=SC2086 # STORM_EDGE_ENV is a list of settings
start edge ${STORM_EDGE_ENV:-} MOBILE_TOKEN="$TOKEN" MOBILE_ROUTER=off MOBILE_LISTEN=127.0.0.1:0 "$WORK/edge"
start router MOBILE_ROUTER_LISTEN=127.0.0.1:0 AGENT=demo "$WORK/router"
EDGE="$(url_of edge "gateway listening")"
url_of router "router listening" >/dev/null

for retry in 0 60s; do
  echo "== $PHONES phones, storm of all of them, -retry $retry" >&2
  "$WORK/loadtest" -url "$EDGE" -token "$TOKEN" -conns "$PHONES" -soak 1s -duration 0s -rate 0 \
    -storm 1 -dial-concurrency 1000 -retry "$retry" -answer-wait 60s -json "$WORK/storm-$retry.json" \
    >"$WORK/report-$retry.txt" 2>"$WORK/loadtest-$retry.log" || true
  cat "$WORK/report-$retry.txt"
done

#!/usr/bin/env bash
# The short load test: two edges (MOBILE_ROUTER=off) and one router as
# processes on loopback, on the local Redis (REDIS_URL, else 127.0.0.1:6379)
# and NATS (NATS_URL, else 127.0.0.1:4222) with prefixes of their own; the
# load generator holds 2,000 connections split over both edges, sends texts
# (answered by the router's demo agent) and router deliveries for 30 s, then
# drops a quarter of the connections at once and waits for them to come back. It fails on any lost
# message or delivery, error frame, unexpected close or failed connection,
# and when a server process died. Then it runs a short smoke of step mode
# (LOADTEST_STEP=0 skips it) and checks the k6 scripts' syntax.
#
# LOADTEST_CONNS, LOADTEST_SOAK, LOADTEST_DURATION, LOADTEST_RATE,
# LOADTEST_DELIVER_RATE and LOADTEST_STORM change the run; LOADTEST_JSON
# keeps the JSON report.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH:/usr/sbin"

CONNS="${LOADTEST_CONNS:-2000}"
SOAK="${LOADTEST_SOAK:-5s}"
DURATION="${LOADTEST_DURATION:-30s}"
RATE="${LOADTEST_RATE:-200}"
DELIVER_RATE="${LOADTEST_DELIVER_RATE:-20}"
STORM="${LOADTEST_STORM:-0.25}"

WORK="$(mktemp -d)"
PIDS=()
# shellcheck source=loadtest/services.sh
source loadtest/services.sh
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== building (no -race: the load test measures the real binaries)"
go build -o "$WORK/edge" ./services/edge
go build -o "$WORK/router" ./services/router
go build -o "$WORK/loadtest" ./loadtest

ID="lt$(random | cut -c1-10)"
TOKEN="$(random)"
DELIVER_TOKEN="$(random)"
# The shared Redis and NATS .ci/run gives the tests (NATS_URL when it
# started its own NATS beside another on 4222).
export NATS_URL="${NATS_URL:-nats://127.0.0.1:4222}" REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
export REDIS_PREFIX="$ID:" NATS_PREFIX="$ID."
export MOBILE_ADMIN_LISTEN=127.0.0.1:0 MOBILE_DRAIN_WINDOW=2

start_gateway
echo "edges $EDGE1 $EDGE2, router $ROUTER (REDIS_PREFIX=$REDIS_PREFIX NATS_PREFIX=$NATS_PREFIX)"

# Server metrics: required once the services serve their admin port.
METRICS=()
if grep -q MOBILE_ADMIN_LISTEN services/edge/*.go services/router/*.go 2>/dev/null; then
  for name in edge1 edge2 router; do
    url="$(url_of "$name" "admin listening")"
    METRICS+=("$name=${url%/}/metrics")
  done
  METRICS_FLAGS=(-metrics "$(IFS=,; echo "${METRICS[*]}")" -require-metrics)
else
  echo "the services do not serve MOBILE_ADMIN_LISTEN yet: server metrics show n/a"
  METRICS_FLAGS=()
fi

echo "== load: $CONNS connections, soak $SOAK, $DURATION of $RATE messages/s and $DELIVER_RATE deliveries/s, storm $STORM"
JSON="${LOADTEST_JSON:-$WORK/report.json}"
status=0
"$WORK/loadtest" -url "$EDGE1,$EDGE2" -token "$TOKEN" -conns "$CONNS" -soak "$SOAK" \
  -duration "$DURATION" -rate "$RATE" -storm "$STORM" \
  -deliver "$ROUTER" -deliver-token "$DELIVER_TOKEN" -deliver-rate "$DELIVER_RATE" \
  "${METRICS_FLAGS[@]}" -json "$JSON" || status=$?

for name in edge1 edge2 router; do
  if ! kill -0 "$(eval echo "\$PID_$name")" 2>/dev/null; then
    echo "$name died during the load test" >&2
    status=1
  fi
done
if [ "$status" -ne 0 ]; then
  for name in edge1 edge2 router; do
    echo "---- $name log (last 40 lines)" >&2
    tail -n 40 "$WORK/$name.log" >&2
  done
  echo "load test FAILED" >&2
  exit "$status"
fi
echo "load test passed"

# Step mode's smoke: every scenario at two low rates on the in-process floor
# and on the cluster. It fails only when a sweep cannot run or answers
# nothing; saturation is a result, not a failure.
if [ "${LOADTEST_STEP:-1}" != 0 ]; then
  echo "== step mode: every scenario at 50 and 100/s, 1 s a step, on the floor and the gateway"
  if ! "$WORK/loadtest" step -scenario all -url "$EDGE1,$EDGE2" -token "$TOKEN" \
    -deliver "$ROUTER" -deliver-token "$DELIVER_TOKEN" -phones 50 -rates 50,100 -step 1s; then
    echo "step mode FAILED" >&2
    exit 1
  fi
fi

echo "== k6 scripts: syntax check with node"
if ! command -v node >/dev/null; then
  if command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs >/dev/null
  else
    echo "node is missing: cannot check loadtest/k6" >&2
    exit 1
  fi
fi
for f in loadtest/k6/*.js loadtest/k6/shim/*.mjs; do
  # Module syntax (import/export); the k6 imports are not resolved by a
  # syntax check (TestK6SoakThroughDrain runs soak.js through the shim).
  node --input-type=module --check <"$f" || { echo "$f: syntax error" >&2; exit 1; }
  echo "ok $f"
done

#!/usr/bin/env bash
# The gateway beside Centrifugo, on the same paths, in one run: builds the
# edge, the router and the load generator (no -race), takes Centrifugo from
# CENTRIFUGO_BIN or builds it from the Go module proxy, and starts
#
#   the gateway in cluster mode: an edge (MOBILE_ROUTER=off), a router
#     (AGENT=demo, a deliver token), a NATS server of its own and the local
#     Redis (127.0.0.1:6379) with a key prefix of its own;
#   Centrifugo with its Redis engine on the same Redis under a prefix of its
#     own, and Centrifugo with its memory engine (CF_ENGINES);
#   the floor (`loadtest floor`, a bare gobwas server that speaks hello →
#     ready and nothing else), a process of its own, for the hello path;
#
# then runs `loadtest sidebyside` against them, one after the other, with the
# same pacing and clocks:
#
#   hello: CF_CONNS sockets opened, 100 handshakes in flight: dial → hello →
#     ready on the gateway and the floor, dial → connect → subscribe to a
#     channel of the socket's own on Centrifugo;
#   single: CF_HELD of them held; at each of CF_RATES one request per
#     message, open-loop: POST /v1/deliver to mobile:<device> against POST
#     /api/publish to the socket's channel;
#   batch: at each of CF_BATCH_RATES, CF_BATCH messages a request: POST
#     /v1/deliver/batch against POST /api/batch (parallel);
#
# every message timed from its request to the socket's receipt and to the
# HTTP response. Any flag of `loadtest sidebyside` may follow (a later flag
# wins).
#
# CF_CONNS=10000       sockets of the hello path
# CF_HELD=1000         sockets held for the deliveries
# CF_RATES=2k,5k,10k   single deliveries per second offered, each for CF_STEP
# CF_BATCH_RATES=50k,100k  deliveries per second offered in batches
# CF_BATCH=500         deliveries a batch request
# CF_STEP=10s          how long each rate is offered
# CF_ENGINES="redis memory"  which Centrifugo engines run (empty: none, the
#                      gateway and the floor only)
# CENTRIFUGO_BIN=<file>  a Centrifugo v6 binary; else CENTRIFUGO_VERSION
#                      (v6.9.1) is built with `go install` into
#                      CENTRIFUGO_CACHE (/tmp/centrifugo-<version>) once
#                      and reused
# EDGE_BIN=<file> ROUTER_BIN=<file>  run those binaries (an earlier commit's)
# CF_DIR=<dir>         keeps the logs, Centrifugo's configs and the JSON report
# CF_PROFILE=<phase>   takes a CPU profile of the edge and the router over the
#                      gateway's hello, single or batch phase (hello: its
#                      first CF_PROFILE_SECONDS, 2; the others: their every
#                      step), into CF_DIR as <process>.pprof beside the
#                      binaries (`go tool pprof -top $CF_DIR/router
#                      $CF_DIR/router.pprof`)
# CF_SERVER_CPUS=<list> CF_DRIVER_CPUS=<list>  pin (taskset -c) every server
#                      (the edge, the router, NATS, Centrifugo, the floor
#                      and the local redis-server, unpinned again at the
#                      end) to one set of cores and the load generator to
#                      another, so that the driver's own work does not
#                      queue behind the servers' on a machine of 2 cores
#
# It prints the table of `loadtest sidebyside`: per path and rate a column
# per server, then the gateway's figure over each Centrifugo's. It exits 1
# when a server died or could not hold the sockets.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH:/usr/sbin"
ENGINES="${CF_ENGINES-redis memory}"
VERSION="${CENTRIFUGO_VERSION:-v6.9.1}"
ulimit -n "$(ulimit -Hn)"

WORK="$(mktemp -d)"
PIDS=()
# shellcheck source=loadtest/services.sh
source loadtest/services.sh
REDIS_PREFIX=""
# shellcheck disable=SC2317 # called by the trap, not unreachable
cleanup() {
  stop_all
  keep_work "${CF_DIR:-}"
}
trap cleanup EXIT

build_binaries
CENTRIFUGO="${CENTRIFUGO_BIN:-}"
if [ -z "$CENTRIFUGO" ] && [ -n "$ENGINES" ]; then
  cache="${CENTRIFUGO_CACHE:-/tmp/centrifugo-$VERSION}"
  CENTRIFUGO="$cache/centrifugo"
  if [ ! -x "$CENTRIFUGO" ]; then
    echo "== building Centrifugo $VERSION into $cache (once)" >&2
    mkdir -p "$cache"
    # Stamped as a release build is, else it calls itself v0.0.0.
    GOBIN="$cache" go install -ldflags "-X github.com/centrifugal/centrifugo/v6/internal/build.Version=${VERSION#v}" \
      "github.com/centrifugal/centrifugo/v6@$VERSION"
  fi
fi

# free_port: a loopback port free now.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

ID="cf$(random | cut -c1-10)"
TOKEN="$(random)"
DELIVER_TOKEN="$(random)"
CF_KEY="$(random)"
CF_SECRET="$(random)"
export REDIS_URL=redis://127.0.0.1:6379
export REDIS_PREFIX="$ID:" NATS_PREFIX="$ID."
export MOBILE_ADMIN_LISTEN=127.0.0.1:0
[ -z "${CF_PROFILE:-}" ] || export MOBILE_PPROF=on
start_nats
start edge MOBILE_TOKEN="$TOKEN" MOBILE_ROUTER=off MOBILE_LISTEN=127.0.0.1:0 "$WORK/edge"
start router MOBILE_ROUTER_LISTEN=127.0.0.1:0 MOBILE_DELIVER_TOKENS="$DELIVER_TOKEN" AGENT=demo "$WORK/router"
EDGE="$(url_of edge "gateway listening")"
ROUTER="$(url_of router "router listening")"
# The redis-server of REDIS_URL, by its own process_id: tests may run
# redis-servers of their own.
REDIS_PID="$(redis-cli -u "$REDIS_URL" info server | tr -d '\r' | sed -n 's/^process_id://p')"
# Each target names its server processes: the driver counts their CPU per
# message received (Redis's includes what else uses the machine's Redis).
# shellcheck disable=SC2154 # PID_* are set by start
TARGETS=(-target "gateway=gateway,$EDGE,$ROUTER,$PID_edge+$PID_router+$PID_nats+$REDIS_PID")
SERVERS=(edge router)

# start_centrifugo ENGINE: Centrifugo with that engine ("redis": the local
# Redis under the key prefix $ID:cf), its config written as JSON, on a port
# of its own; adds its target once its API answers.
start_centrifugo() {
  local engine="$1" port conf engine_json
  port="$(free_port)"
  conf="$WORK/centrifugo-$engine.json"
  engine_json='{"type": "memory"}'
  if [ "$engine" = redis ]; then
    engine_json="{\"type\": \"redis\", \"redis\": {\"address\": [\"$REDIS_URL\"], \"prefix\": \"${ID}:cf\"}}"
  fi
  cat >"$conf" <<EOF
{
  "log": {"level": "warn"},
  "http_server": {"address": "127.0.0.1", "port": $port},
  "http_api": {"key": "$CF_KEY"},
  "client": {"token": {"hmac_secret_key": "$CF_SECRET"}},
  "channel": {"namespaces": [{"name": "sbs", "allow_subscribe_for_client": true}]},
  "engine": $engine_json
}
EOF
  # Centrifugo reads every CENTRIFUGO_* variable as a setting: this script's
  # own (CENTRIFUGO_BIN, …) are not its.
  # shellcheck disable=SC2046 # one -u NAME pair per variable
  start "centrifugo_$engine" $(env | sed -n 's/^\(CENTRIFUGO_[A-Za-z0-9_]*\)=.*/-u \1/p') "$CENTRIFUGO" --config "$conf"
  local pids
  pids="$(eval echo "\$PID_centrifugo_$engine")"
  [ "$engine" != redis ] || pids="$pids+$REDIS_PID"
  for _ in $(seq 1 150); do
    if curl -fsS -o /dev/null -X POST -H "X-API-Key: $CF_KEY" -d '{}' "http://127.0.0.1:$port/api/info" 2>/dev/null; then
      TARGETS+=(-target "centrifugo-$engine=centrifugo,ws://127.0.0.1:$port/connection/websocket,http://127.0.0.1:$port,$pids")
      SERVERS+=("centrifugo_$engine")
      return 0
    fi
    kill -0 "$(eval echo "\$PID_centrifugo_$engine")" 2>/dev/null || break
    sleep 0.1
  done
  echo "centrifugo ($engine) did not answer its API; its log:" >&2
  cat "$WORK/centrifugo_$engine.log" >&2
  return 1
}
for engine in $ENGINES; do start_centrifugo "$engine"; done
start floor MOBILE_TOKEN="$TOKEN" "$WORK/loadtest" floor -listen 127.0.0.1:0
TARGETS+=(-target "floor=floor,$(url_of floor "floor listening"),-")
SERVERS+=(floor)
cf_version=none
[ -z "$ENGINES" ] || cf_version="$("$CENTRIFUGO" version | head -n 1)"
echo "edge $EDGE, router $ROUTER (REDIS_PREFIX=$REDIS_PREFIX NATS_PREFIX=$NATS_PREFIX), Centrifugo $cf_version: ${ENGINES:-no engine}" >&2

DRIVER=()
if [ -n "${CF_SERVER_CPUS:-}" ]; then
  ALL_CPUS="$(taskset -p -c "$REDIS_PID" | sed 's/.*: //')"
  for name in "${SERVERS[@]}" nats; do
    taskset -a -p -c "$CF_SERVER_CPUS" "$(eval echo "\$PID_$name")" >/dev/null
  done
  taskset -a -p -c "$CF_SERVER_CPUS" "$REDIS_PID" >/dev/null
  # shellcheck disable=SC2064 # the values of now
  trap "taskset -a -p -c '$ALL_CPUS' '$REDIS_PID' >/dev/null; cleanup" EXIT
  echo "servers on cores $CF_SERVER_CPUS (Redis $REDIS_PID too, back to $ALL_CPUS at the end)" >&2
fi
[ -z "${CF_DRIVER_CPUS:-}" ] || DRIVER=(taskset -c "$CF_DRIVER_CPUS")

# profile_phase: with CF_PROFILE, waits in the background for the driver's
# line that starts the gateway's phase, then profiles the edge and the
# router over it.
steps() { tr ',' '\n' <<<"$1" | grep -c .; }
profile_phase() {
  local start secs step="${CF_STEP:-10s}" n name admin
  step="${step%s}"
  case "$CF_PROFILE" in
    hello) start='gateway: hello,' secs="${CF_PROFILE_SECONDS:-2}" ;;
    single) start='gateway: [0-9]* of [0-9]* ready' secs=$((step * $(steps "${CF_RATES:-2k,5k,10k}"))) ;;
    batch)
      n="$(steps "${CF_RATES:-2k,5k,10k}")"
      start="gateway: single at" secs=$((step * $(steps "${CF_BATCH_RATES:-50k,100k}"))) ;;
    *) echo "CF_PROFILE: hello, single or batch, not $CF_PROFILE" >&2; return 1 ;;
  esac
  until [ "$(grep -c "$start" "$WORK/driver.log" 2>/dev/null)" -ge "${n:-1}" ]; do sleep 0.1; done
  for name in edge router; do
    admin="$(url_of "$name" "admin listening")"
    curl -sf -o "$WORK/$name.pprof" "$admin/debug/pprof/profile?seconds=$secs" &
  done
  wait
  echo "profiled the gateway's $CF_PROFILE phase for ${secs}s" >&2
}
if [ -n "${CF_PROFILE:-}" ]; then
  profile_phase &
  PROFILER=$!
fi

status=0
MOBILE_TOKEN="$TOKEN" LOADTEST_DELIVER_TOKEN="$DELIVER_TOKEN" CENTRIFUGO_API_KEY="$CF_KEY" CENTRIFUGO_SECRET="$CF_SECRET" \
  "${DRIVER[@]}" "$WORK/loadtest" sidebyside "${TARGETS[@]}" -conns "${CF_CONNS:-10000}" -held "${CF_HELD:-1000}" \
  -rates "${CF_RATES:-2k,5k,10k}" -batch-rates "${CF_BATCH_RATES:-50k,100k}" -batch "${CF_BATCH:-500}" \
  -step "${CF_STEP:-10s}" -json "$WORK/sidebyside.json" "$@" 2> >(tee "$WORK/driver.log" >&2) || status=$?
[ -z "${PROFILER:-}" ] || wait "$PROFILER" || status=1
all_alive "${SERVERS[@]}" || status=1
exit "$status"

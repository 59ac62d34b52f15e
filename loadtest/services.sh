# shellcheck shell=bash
# Shared by the scripts that run the gateway as processes on this machine
# (loadtest/step.sh, loadtest/memory.sh, loadtest/soak.sh,
# loadtest/roundtrip.sh, .ci/loadtest.sh); sourced, after
# the script sets WORK (a directory for the logs) and PIDS (an array).

# random: 32 hex digits.
random() { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; }

# build_binaries: the edge, the router and the load generator into $WORK
# (no -race); EDGE_BIN and ROUTER_BIN, when set, are copied instead (e.g.
# an earlier commit's, to compare in one run).
build_binaries() {
  echo "== building" >&2
  if [ -n "${EDGE_BIN:-}" ]; then cp "$EDGE_BIN" "$WORK/edge"; else go build -o "$WORK/edge" ./services/edge; fi
  if [ -n "${ROUTER_BIN:-}" ]; then cp "$ROUTER_BIN" "$WORK/router"; else go build -o "$WORK/router" ./services/router; fi
  go build -o "$WORK/loadtest" ./loadtest
}

# stop_all [PID...]: stops the given processes (load generators), then
# every process in PIDS, waiting for each, and deletes the Redis keys of
# REDIS_PREFIX when it is set.
stop_all() {
  local pid
  for pid in "$@" "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "$@" "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ -n "${REDIS_PREFIX:-}" ]; then
    redis-cli --scan --pattern "${REDIS_PREFIX}*" | xargs -r -n 1000 redis-cli UNLINK >/dev/null || true
  fi
}

# keep_work DIR: copies $WORK to DIR when DIR is set, then deletes $WORK.
keep_work() {
  if [ -n "$1" ]; then
    mkdir -p "$1" || true
    cp -r "$WORK"/. "$1"/ 2>/dev/null || true
  fi
  rm -rf "$WORK"
}

# start NAME VAR=value... COMMAND: runs COMMAND in the background with its
# log in $WORK/NAME.log, its pid in PIDS and in PID_NAME.
start() {
  local name="$1"; shift
  env "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=("$!")
  eval "PID_$name=$!"
}

# url_of NAME MSG: waits for the JSON log line of NAME whose msg is MSG and
# prints its url; fails after 15 s or when the process exits.
url_of() {
  local name="$1" msg="$2" pid line
  pid="$(eval echo "\$PID_$name")"
  for _ in $(seq 1 150); do
    line="$(grep -m1 "\"msg\":\"$msg\"" "$WORK/$name.log" || true)"
    if [ -n "$line" ]; then
      sed -E 's/.*"url":"([^"]*)".*/\1/' <<<"$line"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "$name: no \"$msg\" log line; its log:" >&2
  cat "$WORK/$name.log" >&2
  return 1
}

# start_nats: a NATS server of the script's own (no JetStream, ports chosen
# by the server), so that its memory is the gateway's alone; sets NATS_URL
# (exported) and NATS_MON (its monitoring address) from the ports file it
# writes, or fails with its log.
start_nats() {
  start nats nats-server -a 127.0.0.1 -p -1 -m -1 --ports_file_dir "$WORK"
  # shellcheck disable=SC2154 # PID_nats is set by start
  local ports="$WORK/nats-server_$PID_nats.ports"
  for _ in $(seq 1 150); do
    [ -s "$ports" ] && break
    kill -0 "$PID_nats" 2>/dev/null || break
    sleep 0.1
  done
  if [ ! -s "$ports" ]; then
    echo "nats-server: no ports file; its log:" >&2
    cat "$WORK/nats.log" >&2
    return 1
  fi
  NATS_URL="$(sed -E 's/.*"nats":\["([^"]*)".*/\1/' "$ports")"
  NATS_MON="$(sed -E 's/.*"monitoring":\["([^"]*)".*/\1/' "$ports")"
  export NATS_URL
}

# start_gateway: two edges (edge1 and edge2, MOBILE_ROUTER=off, token
# TOKEN) and a router (router, AGENT=demo, deliver token DELIVER_TOKEN)
# from the binaries in $WORK; sets EDGE1 and EDGE2 (their /ws URLs) and
# ROUTER (its API's URL) once they listen.
start_gateway() {
  start edge1 MOBILE_TOKEN="$TOKEN" MOBILE_ROUTER=off MOBILE_LISTEN=127.0.0.1:0 "$WORK/edge"
  start edge2 MOBILE_TOKEN="$TOKEN" MOBILE_ROUTER=off MOBILE_LISTEN=127.0.0.1:0 "$WORK/edge"
  start router MOBILE_ROUTER_LISTEN=127.0.0.1:0 MOBILE_DELIVER_TOKENS="$DELIVER_TOKEN" AGENT=demo "$WORK/router"
  EDGE1="$(url_of edge1 "gateway listening")"
  EDGE2="$(url_of edge2 "gateway listening")"
  ROUTER="$(url_of router "router listening")"
}

# metric FILE NAME: the value of the series NAME (no labels) in a
# Prometheus text file, as an integer; NA when absent.
metric() {
  awk -v n="$2" '$1 == n { printf "%.0f\n", $2; f = 1; exit } END { if (!f) print "NA" }' "$1"
}

# connect_phones URL PHONES PER_PROCESS WAIT ADMIN: connects PHONES idle
# phones to the edge at URL from ceil(PHONES / PER_PROCESS) load generator
# processes (their pids in LOADTESTS, which hold the phones for 10 minutes
# unless stopped), waits up to WAIT seconds until every process reports
# its phones connected and the edge (its admin address ADMIN) counts them
# all, and fails otherwise.
connect_phones() {
  local url="$1" phones="$2" per_process="$3" wait="$4" admin="$5" procs i n line done_procs connected conns
  local start=$SECONDS
  # ceil(phones / per_process) processes, the phones split evenly.
  procs=$(((phones + per_process - 1) / per_process))
  echo "== connecting $phones phones from $procs load generator processes" >&2
  for i in $(seq 1 "$procs"); do
    n=$((phones / procs + (i <= phones % procs ? 1 : 0)))
    "$WORK/loadtest" -url "$url" -token "$TOKEN" -conns "$n" -soak 10m -duration 0s -rate 0 -storm 0 \
      -json "$WORK/loadtest-$i.json" >"$WORK/loadtest-$i.log" 2>&1 &
    LOADTESTS+=("$!")
  done

  # Every process logs "<time> N connected in …" when its handshakes are done.
  connected=0
  while :; do
    done_procs=0 connected=0
    for i in $(seq 1 "$procs"); do
      line="$(grep -m1 ' connected in ' "$WORK/loadtest-$i.log" || true)"
      if [ -n "$line" ]; then
        done_procs=$((done_procs + 1))
        connected=$((connected + $(awk '{ print $2 }' <<<"$line")))
      elif ! kill -0 "${LOADTESTS[$((i - 1))]}" 2>/dev/null; then
        echo "load generator $i ended before connecting; its log:" >&2
        cat "$WORK/loadtest-$i.log" >&2
        exit 1
      fi
    done
    [ "$done_procs" -eq "$procs" ] && break
    if [ $((SECONDS - start)) -ge "$wait" ]; then
      echo "the phones did not connect within ${wait}s" >&2
      exit 1
    fi
    sleep 0.5
  done
  if [ "$connected" -ne "$phones" ]; then
    echo "only $connected of $phones phones connected" >&2
    tail -n 5 "$WORK"/loadtest-*.log >&2
    exit 1
  fi
  # The edge counts a connection until its socket is closed: all of them are
  # its, and none is gone.
  conns=""
  for _ in $(seq 1 100); do
    curl -fsS -o "$WORK/metrics-wait.txt" "$admin/metrics"
    conns="$(metric "$WORK/metrics-wait.txt" hermes_connections)"
    [ "$conns" = "$phones" ] && break
    sleep 0.1
  done
  if [ "$conns" != "$phones" ]; then
    echo "the edge counts $conns connections, not $phones" >&2
    exit 1
  fi
}

# all_alive NAME...: fails, printing the log of each, when any of the
# processes started as NAME has ended.
all_alive() {
  local name ok=0
  for name in "$@"; do
    if ! kill -0 "$(eval echo "\$PID_$name")" 2>/dev/null; then
      echo "$name died during the run; its log:" >&2
      tail -n 40 "$WORK/$name.log" >&2
      ok=1
    fi
  done
  return "$ok"
}

#!/usr/bin/env bash
# Installs and upgrades charts/hermes-gateway with helm against a real
# Kubernetes API server, where .ci/helm.sh only lints and renders it: an
# etcd and a kube-apiserver (with kube-controller-manager, so Deployments get
# ReplicaSets and the HPA is acted on) on loopback ports, in a temporary
# directory, stopped and removed on exit. No kubelet and no scheduler: pods
# stay Pending, and nothing waits for them.
#
#  1. Binaries: kube-apiserver, kube-controller-manager and kubectl of
#     Kubernetes v1.37.2, built once into /tmp/kubebin/v1.37.2 (about 15
#     minutes of CPU, go build -p 1: 15 to 35 minutes on 2 cores, depending
#     on what else runs; a later run reuses them when they report v1.37.2). k8s.io/kubernetes replaces its staging modules (k8s.io/api,
#     client-go, ...) with ./staging paths, which a module depending on it
#     cannot follow, so the build runs in a scratch module that requires
#     k8s.io/kubernetes and replaces each of them with its v0.37.2 release.
#     The version is stamped with -ldflags, else the server says v0.0.0 and
#     the chart's kubeVersion (>=1.30.0-0) refuses it. etcd is Debian's
#     (etcd-server, installed when missing); helm is v4.3.2
#     (.ci/helm-bin.sh, as .ci/helm.sh).
#  2. Servers: etcd; kube-apiserver with a serving certificate and a
#     service-account key made with openssl, a static admin token and
#     AlwaysAllow (a throwaway test server), --endpoint-reconciler-type=none
#     (loopback cannot be the advertised endpoint); /readyz is polled.
#     Service IPs are only allocated in etcd: no proxy, no traffic.
#  3. The Prometheus Operator's CRDs (example/prometheus-operator-crd of
#     github.com/prometheus-operator/prometheus-operator at PO_VERSION, from
#     the Go module proxy: no committed copy), applied server-side and waited
#     for until Established, as the production values render a
#     ServiceMonitor and a PrometheusRule.
#  4. helm install with server-side apply (--server-side=true, Helm 4's
#     default, spelled out), for which Helm 4 asks the server for strict
#     field validation (a chart with an unknown field must fail first,
#     proving that this path refuses one), of the default values (release hermes,
#     namespace hermes-default) and of values-production.yaml (namespace
#     hermes-production, with the Secret hermes-tokens it names). Every
#     object of each release is read back from the API server and listed,
#     the HPA must have scaled the edges to its minReplicas and each
#     Deployment must have a ReplicaSet.
#  5. helm upgrade of both with config.logLevel=debug: the ConfigMap changes,
#     so the pods' checksum/config does, and the edge and router Deployments
#     must roll: a new ReplicaSet (revision 2, another pod-template-hash).
#     Then helm uninstall of the default release leaves the chart's Secret
#     (helm.sh/resource-policy: keep).
#
# KUBE_SH_KEEP=1 keeps the temporary directory (logs, kubeconfig) after the
# run. Fails on the first error, printing the servers' last log lines.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

K8S_VERSION=v1.37.2
STAGING_VERSION="v0.${K8S_VERSION#v1.}"   # k8s.io/api etc. v0.37.2
# The newest prometheus-operator the Go module proxy serves.
PO_VERSION=v0.85.0
KUBEBIN="/tmp/kubebin/$K8S_VERSION"
CHART=charts/hermes-gateway
start=$SECONDS

# --- tools -------------------------------------------------------------------
missing=()
command -v etcd >/dev/null || missing+=(etcd-server)
for t in jq curl openssl; do command -v "$t" >/dev/null || missing+=("$t"); done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]} (Debian)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
HELM="$(bash .ci/helm-bin.sh)"

# --- Kubernetes binaries -------------------------------------------------------
# kube_version BIN: the version BIN reports, empty when it does not run.
kube_version() {
  case "$1" in
    kubectl) "$KUBEBIN/kubectl" version --client 2>/dev/null | sed -n 's/^Client Version: //p' ;;
    *) "$KUBEBIN/$1" --version 2>/dev/null | sed -n 's/^Kubernetes //p' ;;
  esac
}
BINS=(kube-apiserver kube-controller-manager kubectl)
build=()
for b in "${BINS[@]}"; do
  [ "$(kube_version "$b")" = "$K8S_VERSION" ] || build+=("$b")
done
if [ "${#build[@]}" -gt 0 ]; then
  echo "building ${build[*]} $K8S_VERSION into $KUBEBIN (15 to 35 minutes on 2 cores, once)"
  src="$KUBEBIN/src"
  mkdir -p "$src"
  kmod="$(cd "$KUBEBIN" && GOWORK=off go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | jq -r .GoMod)"
  {
    echo "module kubebin"
    echo
    grep -m1 '^go ' "$kmod"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # Every staging module k8s.io/kubernetes replaces with a ./staging path.
    awk -v v="$STAGING_VERSION" '$2 == "=>" && $3 ~ /^\.\/staging\// { print "replace " $1 " => " $1 " " v }' "$kmod"
  } >"$src/go.mod"
  grep -q '^replace k8s.io/api ' "$src/go.mod" || { echo "found no staging replacements in $kmod" >&2; exit 1; }
  {
    echo '//go:build tools'
    echo
    echo '// Package kubebin only names the commands built from it, for go mod tidy.'
    echo 'package kubebin'
    echo
    echo 'import ('
    for b in "${BINS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$b\""; done
    echo ')'
  } >"$src/tools.go"
  (cd "$src" && GOWORK=off GOFLAGS=-mod=mod go mod tidy)
  # The servers report component-base's version, kubectl client-go's.
  minor="${K8S_VERSION#v1.}"
  ldflags="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=${minor%%.*}"
  done
  for b in "${build[@]}"; do
    t=$SECONDS
    (cd "$src" && GOWORK=off GOFLAGS=-mod=mod go build -p 1 -ldflags "$ldflags" -o "$KUBEBIN/$b" "k8s.io/kubernetes/cmd/$b")
    echo "built $b in $((SECONDS - t)) s"
  done
fi
for b in "${BINS[@]}"; do
  v="$(kube_version "$b")"
  [ "$v" = "$K8S_VERSION" ] || { echo "$KUBEBIN/$b reports version '$v', want $K8S_VERSION" >&2; exit 1; }
done
echo "kube-apiserver, kube-controller-manager, kubectl: $K8S_VERSION ($KUBEBIN)"
echo "etcd: $(etcd --version | sed -n 's/^etcd Version: //p')"
echo "helm: $("$HELM" version --short)"

# The Prometheus Operator's CRDs, from its module.
mkdir -p "$KUBEBIN"
podir="$(cd "$KUBEBIN" && GOWORK=off go mod download -json "github.com/prometheus-operator/prometheus-operator@$PO_VERSION" | jq -r .Dir)"
crds=("$podir"/example/prometheus-operator-crd/*.yaml)
[ -f "${crds[0]}" ] || { echo "no CRDs in $podir/example/prometheus-operator-crd" >&2; exit 1; }

# --- servers -------------------------------------------------------------------
dir="$(mktemp -d /tmp/kube-sh.XXXXXX)"
pids=()
cleanup() {
  local rc=$? i p
  # The last started first: the controller manager, the API server, etcd.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    p="${pids[i]}"
    kill "$p" 2>/dev/null || continue
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  if [ "$rc" -ne 0 ]; then
    for l in "$dir"/*.log; do
      [ -f "$l" ] && { echo "--- last lines of $l"; tail -n 25 "$l"; }
    done >&2
  fi
  if [ "${KUBE_SH_KEEP:-}" = 1 ]; then echo "kept $dir" >&2; else rm -rf "$dir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# free_port: a TCP port on 127.0.0.1 nothing listens on.
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 20000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
# wait_for WHAT SECONDS COMMAND...: polls COMMAND (a function is fine) every
# half second until it succeeds; fails after SECONDS or when a server exited.
wait_for() {
  local what="$1" deadline=$((SECONDS + $2)) p
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "timed out waiting for $what" >&2; return 1; }
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || { echo "a server exited while waiting for $what" >&2; return 1; }; done
    sleep 0.5
  done
}
t0=$SECONDS
etcd_port="$(free_port)"
peer_port="$(free_port)"
while [ "$peer_port" = "$etcd_port" ]; do peer_port="$(free_port)"; done

etcd --name kube-sh --data-dir "$dir/etcd" --logger zap --log-outputs stderr \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-cluster "kube-sh=http://127.0.0.1:$peer_port" >"$dir/etcd.log" 2>&1 &
pids+=($!); disown
etcd_healthy() { curl -sf "http://127.0.0.1:$etcd_port/health" | grep -q '"health":"true"'; }
wait_for etcd 60 etcd_healthy
api_port="$(free_port)"   # picked while etcd holds its two

# A CA, the API server's certificate for 127.0.0.1, the service-account keys.
(
  cd "$dir"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=kube-sh-ca \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >apiserver.ext
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
    -extfile apiserver.ext -out apiserver.crt 2>/dev/null
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
)
token="$(openssl rand -hex 24)"
echo "$token,admin,admin,system:masters" >"$dir/tokens.csv"
export KUBECONFIG="$dir/kubeconfig"
cat >"$KUBECONFIG" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: kube-sh
    cluster: {server: "https://127.0.0.1:$api_port", certificate-authority: "$dir/ca.crt"}
users:
  - name: admin
    user: {token: "$token"}
contexts:
  - name: kube-sh
    context: {cluster: kube-sh, user: admin}
current-context: kube-sh
EOF
chmod 600 "$KUBECONFIG"

"$KUBEBIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
  --endpoint-reconciler-type none \
  --tls-cert-file "$dir/apiserver.crt" --tls-private-key-file "$dir/apiserver.key" \
  --token-auth-file "$dir/tokens.csv" --authorization-mode AlwaysAllow \
  --service-account-issuer "https://127.0.0.1:$api_port" \
  --service-account-key-file "$dir/sa.pub" --service-account-signing-key-file "$dir/sa.key" \
  --service-cluster-ip-range 10.96.0.0/16 --cert-dir "$dir/apiserver-certs" \
  --profiling=false >"$dir/kube-apiserver.log" 2>&1 &
pids+=($!); disown
api_ready() { curl -sf --cacert "$dir/ca.crt" -H "Authorization: Bearer $token" "https://127.0.0.1:$api_port/readyz" | grep -qx ok; }
wait_for "kube-apiserver /readyz" 180 api_ready

"$KUBEBIN/kube-controller-manager" --kubeconfig "$KUBECONFIG" --leader-elect=false --secure-port 0 \
  --service-account-private-key-file "$dir/sa.key" --root-ca-file "$dir/ca.crt" \
  --profiling=false >"$dir/kube-controller-manager.log" 2>&1 &
pids+=($!); disown
# helm and kubectl keep their caches in the temporary directory, not in ~.
kubectl() { "$KUBEBIN/kubectl" --cache-dir "$dir/kube-cache" "$@"; }
# Its service-account controller gives every namespace a ServiceAccount default.
wait_for "kube-controller-manager" 120 kubectl -n default get serviceaccount default
echo "server: $(kubectl version -o json | jq -r .serverVersion.gitVersion), etcd and kube-controller-manager on 127.0.0.1 (ready in $((SECONDS - t0)) s)"

# --- the Prometheus Operator's CRDs ---------------------------------------------
kubectl apply --server-side --field-manager kube-sh -f "$podir/example/prometheus-operator-crd" >/dev/null
# (kubectl wait fails outright on a CRD that has no status yet.)
established() {
  kubectl get crd servicemonitors.monitoring.coreos.com prometheusrules.monitoring.coreos.com -o json |
    jq -e '[.items[] | select(any(.status.conditions[]?; .type == "Established" and .status == "True"))] | length == 2'
}
wait_for "the CRDs to be established" 60 established
echo "prometheus-operator $PO_VERSION CRDs: $(kubectl get crd -o name | grep -c monitoring.coreos.com) applied"

# --- strict field validation ------------------------------------------------------
# helm with the flags below must refuse an object with a field its kind does
# not have: otherwise a misspelt key of the chart would be dropped silently.
mkdir -p "$dir/strict/templates"
printf 'apiVersion: v2\nname: strict\nversion: 0.0.1\n' >"$dir/strict/Chart.yaml"
printf 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: strict\ndata: {a: b}\nsurplus: 1\n' >"$dir/strict/templates/cm.yaml"
h() { HOME="$dir/home" "$HELM" --kubeconfig "$KUBECONFIG" "$@"; }
if out="$(h install strict "$dir/strict" -n default --server-side=true 2>&1)"; then
  echo "helm installed a ConfigMap with an unknown field: $out" >&2; exit 1
fi
grep -qE 'surplus.*(not declared|unknown)|unknown field "surplus"' <<<"$out" || { echo "unexpected error for an unknown field: $out" >&2; exit 1; }
echo "strict: helm install of a ConfigMap with an unknown field fails: $(tail -n1 <<<"$out")"

# --- install ------------------------------------------------------------------
DEFAULT=(--set auth.token=kube-sh-token-0123456789)
PRODUCTION=(-f "$CHART/values-production.yaml")
kubectl create namespace hermes-production >/dev/null
kubectl -n hermes-production create secret generic hermes-tokens \
  --from-literal=MOBILE_TOKEN=kube-sh-token-0123456789 --from-literal=MOBILE_DELIVER_TOKENS=kube-sh-deliver-0123456789 \
  --from-literal=MOBILE_AGENT_TOKENS=kube-sh-agent-0123456789 --from-literal=REDIS_URL=redis://redis.example:6379/0 >/dev/null

# report NAMESPACE: the release's metadata and every object of its manifest,
# read back from the API server.
report() {
  h get metadata hermes -n "$1" | grep -E '^(CHART|REVISION|STATUS|APPLY_METHOD):' | paste -sd' ' | sed 's/^/  /'
  h get manifest hermes -n "$1" >"$dir/$1.yaml"
  kubectl -n "$1" get -f "$dir/$1.yaml" --no-headers \
    -o custom-columns='KIND:.kind,APIVERSION:.apiVersion,NAME:.metadata.name' | awk '{ printf "  %-24s %-28s %s\n", $1, $2, $3 }'
  echo "  $(kubectl -n "$1" get -f "$dir/$1.yaml" --no-headers -o name | wc -l) objects"
}
# deployments NAMESPACE: each Deployment's replicas, revision and config checksum, and its ReplicaSets.
deployments() {
  kubectl -n "$1" get deployments --no-headers -o custom-columns='NAME:.metadata.name,GEN:.metadata.generation,REPLICAS:.spec.replicas,REV:.metadata.annotations.deployment\.kubernetes\.io/revision,CONFIG:.spec.template.metadata.annotations.checksum/config' |
    awk '{ printf "  deployment %-34s generation %-2s replicas %-2s revision %-2s checksum/config %.12s\n", $1, $2, $3, $4, $5 }'
  kubectl -n "$1" get replicasets --sort-by .metadata.name --no-headers -o custom-columns='NAME:.metadata.name,HASH:.metadata.labels.pod-template-hash,REV:.metadata.annotations.deployment\.kubernetes\.io/revision,DESIRED:.spec.replicas' |
    awk '{ printf "  replicaset %-45s pod-template-hash %-11s revision %-2s replicas %s\n", $1, $2, $3, $4 }'
}
# settled NAMESPACE: every Deployment observed by the controller and with the ReplicaSet of its revision.
settled() {
  kubectl -n "$1" get deployments -o json | jq -e '[.items[] | select(.status.observedGeneration != .metadata.generation
    or .metadata.annotations["deployment.kubernetes.io/revision"] == null)] | length == 0' >/dev/null
}
# hpa_scaled NAMESPACE: the edge HPA has acted: the edge Deployment has its minReplicas.
hpa_scaled() {
  local min
  min="$(kubectl -n "$1" get hpa hermes-hermes-gateway-edge -o jsonpath='{.spec.minReplicas}')"
  [ "$(kubectl -n "$1" get deployment hermes-hermes-gateway-edge -o jsonpath='{.spec.replicas}')" = "$min" ]
}

for ns in hermes-default hermes-production; do
  if [ "$ns" = hermes-default ]; then values=("${DEFAULT[@]}"); else values=("${PRODUCTION[@]}"); fi
  h install hermes "$CHART" -n "$ns" --create-namespace --server-side=true "${values[@]}" >"$dir/install-$ns.out"
  echo
  echo "== helm install hermes -n $ns ${values[*]}"
  report "$ns"
  wait_for "the edge HPA in $ns" 120 hpa_scaled "$ns"
  wait_for "ReplicaSets in $ns" 120 settled "$ns"
  kubectl -n "$ns" get hpa --no-headers -o custom-columns='NAME:.metadata.name,MIN:.spec.minReplicas,MAX:.spec.maxReplicas,CURRENT:.status.currentReplicas,DESIRED:.status.desiredReplicas' |
    awk '{ printf "  hpa %-35s min %s max %s current %s desired %s\n", $1, $2, $3, $4, $5 }'
  deployments "$ns"
  echo "  pods: $(kubectl -n "$ns" get pods --no-headers 2>/dev/null | awk '{ print $3 }' | sort | uniq -c | awk '{ printf "%s%s %s", s, $1, $2; s=", " }') (no scheduler)"
done

# --- upgrade -----------------------------------------------------------------
# rolled NAMESPACE: the edge and router Deployments are at revision 2, observed.
rolled() {
  local d
  for d in edge router; do
    [ "$(kubectl -n "$1" get deployment "hermes-hermes-gateway-$d" -o jsonpath='{.metadata.annotations.deployment\.kubernetes\.io/revision}')" = 2 ] || return 1
  done
  settled "$1"
}
for ns in hermes-default hermes-production; do
  if [ "$ns" = hermes-default ]; then values=("${DEFAULT[@]}"); else values=("${PRODUCTION[@]}"); fi
  h upgrade hermes "$CHART" -n "$ns" --server-side=true "${values[@]}" --set config.logLevel=debug >"$dir/upgrade-$ns.out"
  echo
  echo "== helm upgrade hermes -n $ns ${values[*]} --set config.logLevel=debug"
  h get metadata hermes -n "$ns" | grep -E '^(REVISION|STATUS|APPLY_METHOD):' | paste -sd' ' | sed 's/^/  /'
  [ "$(kubectl -n "$ns" get configmap hermes-hermes-gateway -o jsonpath='{.data.MOBILE_LOG_LEVEL}')" = debug ] ||
    { echo "the ConfigMap in $ns has no MOBILE_LOG_LEVEL debug" >&2; exit 1; }
  wait_for "the rollout in $ns" 120 rolled "$ns"
  deployments "$ns"
done

# --- uninstall ------------------------------------------------------------------
h uninstall hermes -n hermes-default >/dev/null
echo
echo "== helm uninstall hermes -n hermes-default"
kubectl -n hermes-default get secret hermes-hermes-gateway-auth -o name | sed 's/^/  kept: /'
left="$(kubectl -n hermes-default get deployments,services,configmaps,horizontalpodautoscalers -o name | grep -v kube-root-ca.crt || true)"
[ -z "$left" ] || { echo "left after helm uninstall: $left" >&2; exit 1; }
echo
echo "kube.sh: passed in $((SECONDS - start)) s"

#!/usr/bin/env bash
# Checks the deployment files: helm lint and helm template of
# charts/hermes-gateway with the default (plus the required auth.token) and
# the production values, values that violate values.schema.json or a rule
# between two values (each must fail, saying why), then the Go tests of ./deploy, which render the chart again, decode
# every document strictly into the Kubernetes API Go types and check the
# manifests (kinds, probes, preStop, terminationGracePeriodSeconds = preStop
# + drain window + margin, Secrets, names, rollouts) and docker-compose.yml
# against the services' flags; docker-compose.yml is also validated by
# docker-compose.
# Fails on the first error.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

CHART=charts/hermes-gateway
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion).
KUBE_VERSION=1.30.0

# Helm v4.3.2, from PATH or built once into /tmp/helmbin (.ci/helm-bin.sh,
# which .ci/kube.sh shares).
HELM="$(bash .ci/helm-bin.sh)"
export HELM
"$HELM" version --short
# Nothing only Helm 4 reads: the chart API Helm 3 installs.
grep -qx 'apiVersion: v2' "$CHART/Chart.yaml" || { echo "$CHART/Chart.yaml: want apiVersion: v2 (Helm 3 and 4)" >&2; exit 1; }

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# The chart needs an app token (or a Secret of yours): it never makes one up
# at render time, where each render would make a different one.
TOKEN=(--set auth.token=ci-token-0123456789)
"$HELM" lint --strict "$CHART" "${TOKEN[@]}"
"$HELM" lint --strict "$CHART" -f "$CHART/values-production.yaml"
# Every optional piece on (Ingress, HTTPRoute, NetworkPolicies, monitoring).
EVERYTHING=(--set ingress.enabled=true --set httpRoute.enabled=true --set 'httpRoute.parentRefs[0].name=public'
  --set networkPolicy.enabled=true --set metrics.serviceMonitor.enabled=true
  --set metrics.prometheusRule.enabled=true --set metrics.grafanaDashboard.enabled=true
  --set edge.autoscaling.targetConnectionsPerPod=20000)
"$HELM" lint --strict "$CHART" "${TOKEN[@]}" "${EVERYTHING[@]}"
"$HELM" template hermes "$CHART" --kube-version "$KUBE_VERSION" "${TOKEN[@]}" >"$out/default.yaml"
"$HELM" template hermes "$CHART" --kube-version "$KUBE_VERSION" -f "$CHART/values-production.yaml" >"$out/production.yaml"
"$HELM" template hermes "$CHART" --kube-version "$KUBE_VERSION" --set auth.existingSecret=my-tokens >"$out/existing-secret.yaml"
"$HELM" template hermes "$CHART" --kube-version "$KUBE_VERSION" "${TOKEN[@]}" "${EVERYTHING[@]}" >"$out/everything.yaml"
# Without a token, a Redis or a NATS the chart refuses to render, saying what to set.
if err="$("$HELM" template hermes "$CHART" --kube-version "$KUBE_VERSION" 2>&1 >/dev/null)"; then
  echo "helm template rendered without a token" >&2; exit 1
fi
grep -q "set auth.token" <<<"$err" || { echo "unexpected error without a token: $err" >&2; exit 1; }
for svc in redis nats; do
  if err="$("$HELM" template hermes "$CHART" --kube-version "$KUBE_VERSION" "${TOKEN[@]}" --set "$svc.bundled=false" 2>&1 >/dev/null)"; then
    echo "helm template rendered without a $svc URL" >&2; exit 1
  fi
  grep -q "set $svc.url" <<<"$err" || { echo "unexpected error without a $svc URL: $err" >&2; exit 1; }
done
# Values that break the schema (values.schema.json) must not render.
for bad in edge.preStopSleepSeconds=0 edge.drainWindowSeconds=0 edge.terminationMarginSeconds=14 \
    edge.drainWindow=10 router.agent=gpt edge.service.type=External \
    "fullnameOverride=$(printf 'f%.0s' {1..46})" edge.resources.limits.memory=1.5Gi \
    router.agent=openai image.digest=sha256:0123 redis.image=redis@sha256:0123 redis.mode=Cluster; do
  if err="$("$HELM" template hermes "$CHART" --kube-version "$KUBE_VERSION" "${TOKEN[@]}" --set "$bad" 2>&1 >/dev/null)"; then
    echo "helm template rendered with $bad, which the schema forbids" >&2; exit 1
  fi
  grep -q "schema" <<<"$err" || { echo "unexpected error with $bad: $err" >&2; exit 1; }
done
# An external Redis Cluster and NATS cluster: REDIS_MODE reaches the shared
# ConfigMap (edges and routers both read it), NATS_URL keeps its list.
"$HELM" template hermes "$CHART" --kube-version "$KUBE_VERSION" "${TOKEN[@]}" --set redis.bundled=false \
  --set-string 'redis.url=redis://redis-0:7000?addr=redis-1:7000' --set redis.mode=cluster \
  --set nats.bundled=false --set 'nats.url=nats://nats-0:4222\,nats://nats-1:4222' >"$out/clustered.yaml"
grep -q 'REDIS_MODE: "cluster"' "$out/clustered.yaml" || { echo "redis.mode=cluster renders no REDIS_MODE cluster" >&2; exit 1; }
grep -q 'NATS_URL: "nats://nats-0:4222,nats://nats-1:4222"' "$out/clustered.yaml" || { echo "nats.url's list is not NATS_URL" >&2; exit 1; }
# Rules between two values, which the schema cannot state, fail the render
# with a message naming them ("values|message"); equal values render.
for c in "edge.autoscaling.minReplicas=3,edge.autoscaling.maxReplicas=2|edge.autoscaling.maxReplicas (2) is below edge.autoscaling.minReplicas (3)" \
    "router.autoscaling.enabled=true,router.autoscaling.minReplicas=4,router.autoscaling.maxReplicas=3|router.autoscaling.maxReplicas (3) is below router.autoscaling.minReplicas (4)" \
    "metrics.serviceMonitor.enabled=true,metrics.serviceMonitor.interval=30s,metrics.serviceMonitor.scrapeTimeout=31s|metrics.serviceMonitor.scrapeTimeout 31s is longer than metrics.serviceMonitor.interval 30s" \
    "redis.mode=cluster|redis.mode cluster needs an external Redis" "redis.mode=sentinel|redis.mode sentinel needs an external Redis"; do
  if err="$("$HELM" template hermes "$CHART" --kube-version "$KUBE_VERSION" "${TOKEN[@]}" --set "${c%%|*}" 2>&1 >/dev/null)"; then
    echo "helm template rendered with ${c%%|*}" >&2; exit 1
  fi
  grep -qF "${c#*|}" <<<"$err" || { echo "with ${c%%|*}: want \"${c#*|}\", got: $err" >&2; exit 1; }
done
for ok in edge.autoscaling.minReplicas=3,edge.autoscaling.maxReplicas=3 \
    router.autoscaling.enabled=true,router.autoscaling.minReplicas=4,router.autoscaling.maxReplicas=4 \
    metrics.serviceMonitor.enabled=true,metrics.serviceMonitor.interval=30s,metrics.serviceMonitor.scrapeTimeout=30s; do
  "$HELM" template hermes "$CHART" --kube-version "$KUBE_VERSION" "${TOKEN[@]}" --set "$ok" >/dev/null
done
# The production values turn the alerts and the dashboard on.
grep -q "kind: PrometheusRule" "$out/production.yaml" || { echo "the production values render no PrometheusRule" >&2; exit 1; }
grep -q "hermes-gateway.json" "$out/production.yaml" || { echo "the production values render no dashboard" >&2; exit 1; }
wc -l "$out"/*.yaml

# docker-compose.yml, validated by compose itself (no engine needed).
if docker compose version >/dev/null 2>&1; then
  docker compose -f docker-compose.yml config -q
else
  if ! command -v docker-compose >/dev/null; then
    if command -v apt-get >/dev/null; then
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
    fi
  fi
  if command -v docker-compose >/dev/null; then
    docker-compose -f docker-compose.yml config -q
  else
    echo "no docker compose and docker-compose could not be installed" >&2; exit 1
  fi
fi
echo "docker-compose.yml: valid"

# The manifests' and compose file's contents, against the built services;
# TestChartAlerts renders the production values' PrometheusRule and checks
# every alert's for:, its runbook_url's anchor in docs/operations.md and the
# series it names against what a running edge and router serve.
go test -count=1 -v -run 'TestChart|TestCompose|TestDockerfile|TestTaskfile|TestGithubSlug' ./deploy | tee "$out/test.log"
if grep -q -- '--- SKIP' "$out/test.log"; then
  echo "a deploy test was skipped: helm or docker-compose is missing" >&2; exit 1
fi

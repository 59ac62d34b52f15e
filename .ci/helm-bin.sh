#!/usr/bin/env bash
# Prints the path of the helm binary the chart is checked with (Helm v4.3.2),
# building it first when there is none: .ci/helm.sh (lint and render) and
# .ci/kube.sh (install and upgrade against a real API server) both take it
# from here, so they test with the same helm.
#
#   HELM="$(bash .ci/helm-bin.sh)"
#
# helm from PATH when it is that version, else built once into
# /tmp/helmbin/<version> (the first build takes about five minutes; later runs
# reuse it). helm version --short prints "v4.3.2+g<commit>" for a release
# binary; go install would leave Helm's version string at its source default
# ("v4.3"), so the build stamps the release's with -ldflags, and a binary
# there is reused only when the Go build info says it was built from that
# module version. Only the path goes to stdout; progress goes to stderr.
set -euo pipefail
export PATH="/usr/local/go/bin:$PATH"

# Helm 4 (the chart stays apiVersion v2 with nothing Helm 4 alone reads, so
# Helm 3 installs it as well).
HELM_VERSION=v4.3.2
HELM_MODULE=helm.sh/helm/v4
HELM_BIN="/tmp/helmbin/$HELM_VERSION/helm"

helm_is() {
  local v
  v="$("$1" version --short 2>/dev/null)" || return 1
  [ "${v%%+*}" = "$HELM_VERSION" ]
}
if command -v helm >/dev/null && helm_is "$(command -v helm)"; then
  HELM="$(command -v helm)"
else
  if ! { helm_is "$HELM_BIN" && go version -m "$HELM_BIN" 2>/dev/null |
      grep -qE "^[[:space:]]+mod[[:space:]]+${HELM_MODULE}[[:space:]]+$HELM_VERSION([[:space:]]|$)"; }; then
    echo "building helm $HELM_VERSION into $(dirname "$HELM_BIN")" >&2
    GOBIN="$(dirname "$HELM_BIN")" GOFLAGS="" go install \
      -ldflags "-X $HELM_MODULE/internal/version.version=$HELM_VERSION" "$HELM_MODULE/cmd/helm@$HELM_VERSION" >&2
  fi
  HELM="$HELM_BIN"
fi
helm_is "$HELM" || { echo "$HELM is not helm $HELM_VERSION: $("$HELM" version --short 2>&1)" >&2; exit 1; }
echo "$HELM"

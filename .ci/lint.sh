#!/usr/bin/env bash
# The linters CI runs before the tests: gofmt, go vet, staticcheck and
# golangci-lint (.golangci.yml). staticcheck and golangci-lint are built with
# `go install` at the pinned versions below, through the Go module proxy,
# into $(go env GOPATH)/bin: about two minutes on a machine that has built
# neither, skipped when those versions are already there.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

STATICCHECK_VERSION=v0.8.2     # honnef.co/go/tools
GOLANGCI_LINT_VERSION=v2.15.0  # github.com/golangci/golangci-lint/v2

LINT_BIN="$(go env GOPATH)/bin"
export PATH="$LINT_BIN:$PATH"

# tool BINARY MODULE VERSION: installs MODULE/cmd/BINARY@VERSION unless the
# binary in LINT_BIN was built from exactly that module version.
tool() {
  if ! go version -m "$LINT_BIN/$1" 2>/dev/null |
      grep -qE "^[[:space:]]+mod[[:space:]]+$2[[:space:]]+$3([[:space:]]|$)"; then
    echo "installing $1 $3"
    GOBIN="$LINT_BIN" go install "$2/cmd/$1@$3"
  fi
}

start=$SECONDS
tool staticcheck honnef.co/go/tools "$STATICCHECK_VERSION"
tool golangci-lint github.com/golangci/golangci-lint/v2 "$GOLANGCI_LINT_VERSION"
echo "linters ready in $((SECONDS - start)) s"

unformatted="$(gofmt -l .)"
if [ -n "$unformatted" ]; then
  echo "gofmt -l: these files are not formatted:" >&2
  echo "$unformatted" >&2
  exit 1
fi
go vet ./...
staticcheck ./...
golangci-lint run ./...
echo "linters passed in $((SECONDS - start)) s"

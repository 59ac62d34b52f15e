# syntax=docker/dockerfile:1
#
# One image holds both services as static binaries:
#   /usr/local/bin/hermes-edge    (the default entrypoint)
#   /usr/local/bin/hermes-router  (run it with --entrypoint or a command)
#   /usr/local/bin/hermes-probe   (an HTTP health check for images without a shell)
#
#   docker build -t hermes-gateway .
#   docker run --rm -p 8787:8787 hermes-gateway      # a complete single node
#
# A release stamps its version and revision (hermes_build_info, the OTel
# service.version, the image's OCI labels):
#
#   docker build --build-arg VERSION=1.2.3 --build-arg REVISION=$(git rev-parse HEAD) -t hermes-gateway:1.2.3 .
#
# Multi-platform: the Go toolchain runs on the build machine's platform and
# cross-compiles for each target (no emulation):
#
#   docker buildx build --platform linux/amd64,linux/arm64 -t registry.example.com/hermes-gateway:1.2.3 --push .
#
# Base images: pin them by digest for reproducible builds, e.g.
#   --build-arg GO_IMAGE=golang:1.26@sha256:<digest>
#   --build-arg BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot@sha256:<digest>
# (docker buildx imagetools inspect <image> prints the digest).

ARG GO_IMAGE=golang:1.26
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM --platform=$BUILDPLATFORM ${GO_IMAGE} AS build
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-trimpath
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    export GOOS=$TARGETOS GOARCH=$TARGETARCH && \
    LDFLAGS="-s -w -X github.com/hermes-mobile/gateway/pkg/telemetry.Version=${VERSION}" && \
    go build -ldflags "$LDFLAGS" -o /out/hermes-edge ./services/edge && \
    go build -ldflags "$LDFLAGS" -o /out/hermes-router ./services/router && \
    go build -ldflags "-s -w" -o /out/hermes-probe ./deploy/probe

# distroless/static: CA certificates, tzdata and a nonroot user (65532), no shell.
FROM ${BASE_IMAGE}
ARG BASE_IMAGE
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="hermes-gateway" \
      org.opencontainers.image.description="Hermes Mobile Gateway: WebSocket edges and routers for the Hermes mobile app" \
      org.opencontainers.image.source="https://github.com/hermes-mobile/gateway" \
      org.opencontainers.image.url="https://github.com/hermes-mobile/gateway" \
      org.opencontainers.image.documentation="https://github.com/hermes-mobile/gateway/blob/main/docs/operations.md" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
# In a container the services listen on every interface; the admin ports
# (/healthz, /readyz, /metrics) are set per service: edge 8789, router 8790.
ENV MOBILE_LISTEN=0.0.0.0:8787 MOBILE_ROUTER_LISTEN=0.0.0.0:8788
# 8787 edge WebSocket (/ws), 8788 router API, 8789 edge admin, 8790 router admin
EXPOSE 8787 8788 8789 8790
ENTRYPOINT ["/usr/local/bin/hermes-edge"]

# syntax=docker/dockerfile:1
#
# One image holds both services as static binaries:
#   /usr/local/bin/hermes-edge    (the default entrypoint)
#   /usr/local/bin/hermes-router  (run it with --entrypoint or a command)
#   /usr/local/bin/hermes-probe   (an HTTP health check for images without a shell)
#
#   docker build -t hermes-gateway .
#   docker run --rm -p 8787:8787 hermes-gateway      # a complete single node

FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-trimpath
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -ldflags "-s -w" -o /out/hermes-edge ./services/edge && \
    go build -ldflags "-s -w" -o /out/hermes-router ./services/router && \
    go build -ldflags "-s -w" -o /out/hermes-probe ./deploy/probe

# distroless/static: CA certificates, tzdata and a nonroot user (65532), no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
# In a container the services listen on every interface; the admin ports
# (/healthz, /readyz, /metrics) are set per service: edge 8789, router 8790.
ENV MOBILE_LISTEN=0.0.0.0:8787 MOBILE_ROUTER_LISTEN=0.0.0.0:8788
# 8787 edge WebSocket (/ws), 8788 router API, 8789 edge admin, 8790 router admin
EXPOSE 8787 8788 8789 8790
ENTRYPOINT ["/usr/local/bin/hermes-edge"]

# network-node-manager image: a static Go binary on Debian bookworm-slim with the netfilter tools the
# agent drives (iptables-nft, iptables-legacy, ip6tables-*, their -save/-restore, and nft).
#
#   docker build --build-arg VERSION=$(hack/version.sh --release) --build-arg COMMIT=$(git rev-parse --short=12 HEAD) \
#     -t network-node-manager:$(hack/version.sh --release) .   (the release's tag, which the manifests run;
#   hack/version.sh without --release for a pre-release of the commit. make image and make release
#   do the same without Docker, make release for linux/amd64 and linux/arm64)
#
# Runtime needs (see deploy/base/daemonset.yaml): root in the host network namespace with only
# CAP_NET_ADMIN (+ CAP_NET_RAW for iptables-legacy), read-only root filesystem, and the host's
# /run/xtables.lock mounted. Nothing in the image is written at run time.

# ---- build ----
FROM golang:1.26-bookworm AS build
WORKDIR /src
# Dependencies first, so that source edits reuse the module cache layer.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/network-node-manager ./cmd/network-node-manager \
 && /out/network-node-manager version

# ---- runtime ----
FROM debian:bookworm-slim
# iptables brings both variants (iptables-nft is the default alternative; the agent calls the
# variant-specific binaries iptables-nft-* / iptables-legacy-* itself, so alternatives do not matter).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iptables nftables \
 && rm -rf /var/lib/apt/lists/* \
 && iptables-nft-save --version && iptables-legacy-save --version && nft --version
COPY --from=build /out/network-node-manager /usr/local/bin/network-node-manager
# Names no label bit the agent sets; without it iptables-save warns once per connlabel rule.
COPY deploy/image/connlabel.conf /etc/xtables/connlabel.conf
# Netfilter needs uid 0 in the node's network namespace; capabilities are limited by the pod spec.
USER 0:0
# The container ports of deploy/base: 9484 /metrics (metricsAddress), 9485 the plain-HTTP probes
# /livez, /readyz, /healthz (healthzAddress). deploy/dockerfile_test.go keeps the three in step.
EXPOSE 9484 9485
ENTRYPOINT ["/usr/local/bin/network-node-manager"]
CMD ["run"]

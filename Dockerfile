# network-node-manager image: a static Go binary on Debian bookworm-slim with the netfilter tools the
# agent drives (iptables-nft, iptables-legacy, ip6tables-*, their -save/-restore, and nft).
#
#   docker build --build-arg VERSION=$(make -s version) --build-arg COMMIT=$(git rev-parse --short=12 HEAD) \
#     -t network-node-manager:$(make -s version) .   (this commit's version: the release at its commit,
#   a pre-release at any other. make image and make release do the same without Docker, make
#   release for linux/amd64 and linux/arm64, signed, with SBOMs: docs/deploy.md)
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
# The versions are hack/image/bookworm-*.lock's, the pinned base of make image and make release
# (deploy/dockerfile_test.go keeps them in step). The base image is the tag: no registry can be
# reached where this project builds, to read and pin its digest; make release's images are built
# from the pinned packages instead (hack/image.sh).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iptables=1.8.9-2 nftables=1.0.6-2+deb12u2 \
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

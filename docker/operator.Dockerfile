# ghcr.io/meshplane/operator: the meshplane-operator binary on a distroless base.
# Build from the repository root: docker build -f docker/operator.Dockerfile -t ghcr.io/meshplane/operator:0.1.0 .
# Rust 1.91: the oldest toolchain the locked dependencies build with (the workspace's rust-version).
FROM rust:1.91-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p meshplane-operator --bin meshplane-operator

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/meshplane-operator /usr/local/bin/meshplane-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/meshplane-operator"]

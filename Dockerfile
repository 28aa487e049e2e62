# The image the bundles under deploy/ run: ghcr.io/orrery-io/orrery:<version>.
#   docker build -t ghcr.io/orrery-io/orrery:0.1.0 .
# One binary (server, agent and every command), non-root (uid 65532), with the C runtime and
# CA certificates only.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p orrery && strip target/release/orrery

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/orrery /usr/local/bin/orrery
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/orrery"]
CMD ["--help"]

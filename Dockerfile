# One image runs every service: `fleet <subcommand>`.
# Dependencies build in their own layer (cargo-chef), so a source change
# rebuilds only the workspace's crates. Base images are pinned by version.
FROM rust:1.95-bookworm AS chef
RUN cargo install --locked cargo-chef@0.1.78
WORKDIR /src

FROM chef AS plan
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS build
COPY --from=plan /src/recipe.json recipe.json
RUN cargo chef cook --release --locked --recipe-path recipe.json --bin fleet
COPY . .
RUN cargo build --release --locked --bin fleet && strip target/release/fleet

# Pin the digest (debian:12-slim@sha256:...) where images are mirrored.
FROM debian:12-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/fleet /usr/local/bin/fleet
# Non-root; the root filesystem can be read-only (nothing is written).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/fleet"]

# One image runs every service: `fleet <subcommand>`.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin fleet

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/fleet /usr/local/bin/fleet
USER 65534:65534
ENTRYPOINT ["/usr/local/bin/fleet"]

# One image for both controllers (`tether-controller leader|agent`) plus the `tether` CLI:
# they share every dependency, so one image is about the size of either alone, and there is one
# thing to build, scan, sign and pin. The charts pick the role with the first argument.
#
#   docker build -t ghcr.io/tether-dev/tether:0.1.0 --build-arg TETHER_GIT_SHA=$(git rev-parse --short HEAD) .
#
# `make image-check` runs the build stage's cargo command on the host (no container engine needed).

FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
ARG TETHER_GIT_SHA=dev
ENV TETHER_GIT_SHA=${TETHER_GIT_SHA} CARGO_TERM_PROGRESS_WHEN=never
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release -p tether-controller -p tether-cli \
 && mkdir -p /out \
 && cp target/release/tether-controller target/release/tether /out/

# distroless/cc: glibc and CA certificates only; no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/tether-controller /out/tether /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tether-controller"]
CMD ["--help"]

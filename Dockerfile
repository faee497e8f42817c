# One image for both controllers (`tether-controller leader|agent`) plus the `tether` CLI:
# static musl binaries in an otherwise empty image (no shell, no libc, no package manager),
# running as a non-root user. The charts pick the role with the first argument.
#
# Users, with a container engine:
#   docker build -t ghcr.io/tether-dev/tether:0.2.0 --build-arg TETHER_GIT_SHA=$(git rev-parse --short HEAD) .
# The project, with no daemon and no registry (`make image`, e2e/image.sh): the same binaries are
# built on the host with the same cargo command, then
#   buildah bud --build-arg BINARIES=prebuilt ...
# puts them into the same final stage; the `build` stage is then never used, so nothing is pulled.
# `make release` (e2e/release.sh) builds it for linux/amd64 and linux/arm64 that way.

ARG BINARIES=build

FROM docker.io/library/rust:1.95-alpine AS build
RUN apk add --no-cache musl-dev
WORKDIR /src
ARG TETHER_GIT_SHA=dev
ENV TETHER_GIT_SHA=${TETHER_GIT_SHA} CARGO_TERM_PROGRESS_WHEN=never
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release --target x86_64-unknown-linux-musl -p tether-controller -p tether-cli \
 && mkdir -p /out \
 && cp target/x86_64-unknown-linux-musl/release/tether-controller target/x86_64-unknown-linux-musl/release/tether /out/

FROM scratch AS prebuilt
# The Rust target the binaries were built for: `make release` builds the arm64 image from
# aarch64-unknown-linux-musl binaries (buildah bud --arch arm64 --build-arg RUST_TARGET=...).
ARG RUST_TARGET=x86_64-unknown-linux-musl
# Where they are: the release build's folder; `make test` builds the node tier's image from its
# own test build instead (e2e/image.sh --test-build: BINARY_DIR=target/images/test-build).
ARG BINARY_DIR=target/${RUST_TARGET}/release
COPY ${BINARY_DIR}/tether-controller ${BINARY_DIR}/tether /out/

FROM ${BINARIES} AS binaries

FROM scratch
COPY --from=binaries /out/tether-controller /out/tether /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tether-controller"]
CMD ["--help"]

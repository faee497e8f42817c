#!/usr/bin/env bash
# Builds the Tether image from the Dockerfile with no daemon and no registry, plus the test
# nodes' sandbox (pause) image, as docker archives that the node tier imports into containerd:
#   target/images/tether.tar   ghcr.io/tether-dev/tether:<chart appVersion>
#   target/images/pause.tar    tether.test/pause:1
# The binaries are built on the host with the Dockerfile's own cargo command (static, musl) and
# `buildah bud --build-arg BINARIES=prebuilt` puts them into the Dockerfile's final stage; its
# `build` stage is skipped, so nothing is pulled. `docker build .` gives users the same image.
#   e2e/image.sh               the release build, as users get it (make image, make demo)
#   e2e/image.sh --test-build  make test's: the same Dockerfile around the static musl binaries
#                              the test build made (target/x86_64-unknown-linux-musl/debug,
#                              stripped into target/images/test-build); no second compile
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
target=x86_64-unknown-linux-musl
out=$root/target/images
store=$root/target/buildah
version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/tether-leader/Chart.yaml)
image=ghcr.io/tether-dev/tether:$version
pause_image=tether.test/pause:1
start=$SECONDS

say() { printf '[image %3ss] %s\n' "$((SECONDS - start))" "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

for tool in buildah musl-gcc; do
  command -v "$tool" >/dev/null || die "'$tool' is not installed: run 'make tools' (it installs the node-tier packages)"
done
rustup target list --installed 2>/dev/null | grep -qx "$target" \
  || die "the Rust target $target is not installed: run 'make tools' (or rustup target add $target)"

bah() { buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs "$@"; }

mkdir -p "$out"
if [[ ${1:-} == --test-build ]]; then
  built=target/$target/debug
  for b in tether-controller tether; do
    [[ -x $built/$b ]] || die "$built/$b is missing: make test's build job makes it (cargo build --target $target)"
  done
  # NB: relative: the Dockerfile copies from its build context, the repository.
  dir=target/images/test-build
  mkdir -p "$dir"
  for b in tether-controller tether; do
    if [[ ! -f $dir/$b || $built/$b -nt $dir/$b ]]; then
      cp "$built/$b" "$dir/$b.partial" && strip "$dir/$b.partial" && mv "$dir/$b.partial" "$dir/$b"
    fi
  done
  say "the test build's binaries ($built, stripped into $dir)"
else
  say "cargo build --release --target $target -p tether-controller -p tether-cli"
  grep -q "cargo build --locked --release --target $target -p tether-controller -p tether-cli" Dockerfile \
    || die "the Dockerfile's cargo command changed: update e2e/image.sh to match it"
  CC_x86_64_unknown_linux_musl=musl-gcc TETHER_GIT_SHA=${TETHER_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo dev)} \
    cargo build --locked --release --target "$target" -p tether-controller -p tether-cli
  dir=target/$target/release
fi

bins=("$dir/tether-controller" "$dir/tether")
# NB: the archive remembers which build it holds: a release image is never taken for a test
# build's or the other way round.
stamp=$out/tether.tar.from
if [[ -f $out/tether.tar && $(cat "$stamp" 2>/dev/null) == "$dir" \
      && -z $(find "${bins[@]}" Dockerfile -newer "$out/tether.tar") ]]; then
  say "$image is up to date ($out/tether.tar, from $dir)"
else
  say "buildah bud $image (Dockerfile, BINARIES=prebuilt, BINARY_DIR=$dir)"
  bah bud --quiet --isolation chroot --build-arg BINARIES=prebuilt --build-arg "BINARY_DIR=$dir" \
    -t "$image" -f Dockerfile . >/dev/null
  rm -f "$out/tether.tar.partial"
  bah push --quiet "$image" "docker-archive:$out/tether.tar.partial:$image"
  mv "$out/tether.tar.partial" "$out/tether.tar"
  echo "$dir" > "$stamp"
  bah rmi --all --force >/dev/null 2>&1 || true
fi

if [[ -f $out/pause.tar && -z $(find e2e/images/pause -newer "$out/pause.tar") ]]; then
  say "$pause_image is up to date"
else
  say "building $pause_image (e2e/images/pause)"
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  musl-gcc -static -Os -Wall -o "$ctx/pause" e2e/images/pause/pause.c
  cp e2e/images/pause/Containerfile "$ctx/"
  bah bud --quiet --isolation chroot -t "$pause_image" -f "$ctx/Containerfile" "$ctx" >/dev/null
  rm -f "$out/pause.tar.partial"
  bah push --quiet "$pause_image" "docker-archive:$out/pause.tar.partial:$pause_image"
  mv "$out/pause.tar.partial" "$out/pause.tar"
  bah rmi --all --force >/dev/null 2>&1 || true
fi

size=$(du -k "${bins[@]}" | awk '{s += $1} END {printf "%.1f", s / 1024}')
say "done: $image in $out/tether.tar ($(du -h "$out/tether.tar" | cut -f1) archive, binaries ${size} MiB), $pause_image in $out/pause.tar"

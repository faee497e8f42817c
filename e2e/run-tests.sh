#!/usr/bin/env bash
# The test step of `make test`: every test of the workspace. The long tests, ignored by a plain
# `cargo test` (tests/renewal.rs and tests/outage.rs: about 14 and 13 minutes, mostly waiting for
# credentials to expire), run in the background beside the others, so they add little wall time.
set -uo pipefail
cd "$(dirname "$0")/.."
cargo=${CARGO:-cargo}
mkdir -p target
# Build every test once, before two cargo runs share target/.
$cargo test --locked --workspace --no-run || exit 1

# The long tests wait out credential lifetimes; each runs beside the rest in the background.
LONG="renewal outage"
echo "== long tests (tests/renewal.rs about 14 min, tests/outage.rs about 13 min) start in the background; output in target/test-long-<name>.log"
pids=""
for t in $LONG; do
  (
    $cargo test --locked -p tether-e2e --test "$t" -- --ignored --nocapture >"target/test-long-$t.log" 2>&1
    echo $? >"target/test-long-$t.rc"
  ) &
  pids="$pids $!"
done

$cargo test --locked --workspace --no-fail-fast 2>&1 | tee target/test-output.log
rc=${PIPESTATUS[0]}
# The soak's heap-stats build (`make soak HEAP=1`): its own allocator, its own unit test.
echo "== tether-controller --features heap-stats (unit tests)"
$cargo test --locked -p tether-controller --features heap-stats --lib 2>&1 | tee -a target/test-output.log
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

running() {
  for p in $pids; do kill -0 "$p" 2>/dev/null && return 0; done
  return 1
}
start=$SECONDS
while running; do
  for t in $LONG; do
    echo "== waiting for the long tests ($((SECONDS - start)) s) $t: $(grep -v '^\s*$' "target/test-long-$t.log" | grep -v 'kube_client' | tail -1 | cut -c1-120)"
  done
  sleep 30
done
long_rc=0
for t in $LONG; do
  rc_t=$(cat "target/test-long-$t.rc" 2>/dev/null || echo 1)
  echo "== long test tests/$t.rs, exit $rc_t:"
  grep -E '^test |^test result:|panicked|renewed|Ready|expire|^== \[' "target/test-long-$t.log"
  if [ "$rc_t" != 0 ]; then
    long_rc=1
    echo "---- target/test-long-$t.log (last 80 lines) ----"
    tail -80 "target/test-long-$t.log"
  fi
done

awk '/^test result:/ {p += $4; f += $6} END {printf "\ntests: %d passed, %d failed\n", p, f}' \
  target/test-output.log target/test-long-*.log
[ "$rc" = 0 ] && [ "$long_rc" = 0 ]

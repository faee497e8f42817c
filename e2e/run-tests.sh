#!/usr/bin/env bash
# The test step of `make test`: every test of the workspace. The long tests, ignored by a plain
# `cargo test` (tests/renewal.rs: about 14 minutes, mostly waiting for credentials to expire),
# run in the background beside the others, so they add little wall time.
set -uo pipefail
cd "$(dirname "$0")/.."
cargo=${CARGO:-cargo}
mkdir -p target
# Build every test once, before two cargo runs share target/.
$cargo test --locked --workspace --no-run || exit 1

echo "== long tests (tests/renewal.rs, about 14 min) start in the background; output in target/test-long.log"
(
  $cargo test --locked -p tether-e2e --test renewal -- --ignored --nocapture >target/test-long.log 2>&1
  echo $? >target/test-long.rc
) &
long=$!

$cargo test --locked --workspace --no-fail-fast 2>&1 | tee target/test-output.log
rc=${PIPESTATUS[0]}
# The soak's heap-stats build (`make soak HEAP=1`): its own allocator, its own unit test.
echo "== tether-controller --features heap-stats (unit tests)"
$cargo test --locked -p tether-controller --features heap-stats --lib 2>&1 | tee -a target/test-output.log
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

start=$SECONDS
while kill -0 "$long" 2>/dev/null; do
  echo "== waiting for the long tests ($((SECONDS - start)) s): $(grep -v '^\s*$' target/test-long.log | tail -1 | cut -c1-120)"
  sleep 30
done
wait "$long"
long_rc=$(cat target/test-long.rc 2>/dev/null || echo 1)
echo "== long tests (tests/renewal.rs), exit $long_rc:"
grep -E '^test |^test result:|panicked|renewed|Ready|expire' target/test-long.log
if [ "$long_rc" != 0 ]; then
  echo "---- target/test-long.log (last 80 lines) ----"
  tail -80 target/test-long.log
fi

awk '/^test result:/ {p += $4; f += $6} END {printf "\ntests: %d passed, %d failed\n", p, f}' \
  target/test-output.log target/test-long.log
[ "$rc" = 0 ] && [ "$long_rc" = 0 ]

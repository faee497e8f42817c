#!/usr/bin/env bash
# `make test-upgrade FROM=<tag>`: an upgrade from an earlier release on real nodes
# (e2e/tests/upgrade.rs). The tag is checked out in a worktree under target/upgrade/<tag>, where
# its own `e2e/image.sh` builds its image and CLI (cached: a second run rebuilds nothing); both
# images are imported into the test nodes. About 15 minutes, plus the first build of the tag.
set -euo pipefail
cd "$(dirname "$0")/.."
from=${FROM:?set FROM, e.g. make test-upgrade FROM=v0.1.0}
cargo=${CARGO:-cargo}
# NB: v0.1.0 is commit e78c5f8; a clone without the tag can say FROM=e78c5f8.
git rev-parse -q --verify "$from^{commit}" >/dev/null \
  || { echo "error: $from is neither a tag nor a commit here (git fetch --tags? v0.1.0 is e78c5f8)" >&2; exit 2; }
dir=target/upgrade/$from
if [[ ! -e $dir/.git ]]; then
  git worktree prune
  git worktree add --detach "$dir" "$from"
fi
echo "== building $from's image and CLI in $dir (cached after the first run)"
(cd "$dir" && CARGO_INCREMENTAL=0 bash e2e/image.sh)
echo "== upgrade test: $from -> $(git describe --tags --always)"
TETHER_UPGRADE_FROM_DIR=$PWD/$dir TETHER_EXTRA_IMAGES=$PWD/$dir/target/images/tether.tar \
  $cargo test --locked -p tether-e2e --test upgrade -- --ignored --nocapture

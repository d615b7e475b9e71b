#!/usr/bin/env bash
# Regenerates the generated pages of the docs (docs/src/reference/): the command-line
# reference from clap, the settings from abi/src/settings.rs, the ops from abi's schemas.
# cli/tests/docs.rs fails when a committed page differs from what this writes.
#
# Usage: scripts/gen-docs.sh [path/to/mollm]     (default: target/release/mollm)
set -euo pipefail
cd "$(dirname "$0")/.."
MOLLM="${1:-target/release/mollm}"
[[ -x "$MOLLM" ]] || { echo "gen-docs.sh: $MOLLM not found (cargo build --release -p mollm-cli)" >&2; exit 1; }
for page in cli settings ops; do
  "$MOLLM" __docs "$page" > "docs/src/reference/$page.md"
  echo "wrote docs/src/reference/$page.md"
done

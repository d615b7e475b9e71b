#!/usr/bin/env bash
# Builds the docs (docs/, an mdBook) and checks their links. Installs mdbook from crates.io
# when it is missing (the version below, into ~/.cargo/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
MDBOOK_VERSION=0.5.4
if ! command -v mdbook >/dev/null || [[ "$(mdbook --version)" != "mdbook v$MDBOOK_VERSION" ]]; then
  echo "check-docs.sh: installing mdbook $MDBOOK_VERSION from crates.io" >&2
  cargo install --quiet --locked mdbook --version "$MDBOOK_VERSION" --no-default-features --features search
fi
export PATH="$HOME/.cargo/bin:$PATH"
mdbook build docs
python3 scripts/check-doc-links.py

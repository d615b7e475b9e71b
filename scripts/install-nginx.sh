#!/usr/bin/env bash
# nginx from Debian's packages, for cli/tests/replicas.rs (two `mollm serve` replicas behind it
# on 127.0.0.1). The test runs its own nginx with its own configuration in a scratch folder;
# the system service the package starts is stopped again. Exit status 1: not installed.
set -euo pipefail
if command -v nginx >/dev/null; then
  exit 0
fi
{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null; } ||
  { echo "install-nginx.sh: could not install nginx" >&2; exit 1; }
# The package starts the default site on port 80: nothing here needs it.
service nginx stop >/dev/null 2>&1 || pkill -x nginx || true
command -v nginx >/dev/null

#!/usr/bin/env bash
# The tests: installs what they need (Debian packages, as root or with sudo), then
# runs every crate's own tests (`cargo test`), the integration suite, and the
# integration suite a second time with every server a Valkey 8
# (`COWBOY_TEST_ENGINE=valkey`). The integration suite runs under cargo-nextest
# when it is installed (one process per test, which keeps both cores busy to the
# end: about a sixth less time than `cargo test` here), under `cargo test`
# otherwise. Arguments are passed on to each run (a test name filters). Every
# test starts its own private servers on free loopback ports; nothing here
# touches the machine's own services.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh \
  redis-server=redis-server \
  ss=iproute2 \
  nix-instantiate=nix-bin \
  systemd-analyze=systemd \
  postfix=postfix \
  dovecot=dovecot-imapd,dovecot-lmtpd \
  dnsmasq=dnsmasq-base \
  prometheus=prometheus \
  chromium=chromium \
  chromedriver=chromium-driver
bash scripts/install-valkey.sh
bash scripts/install-mcp.sh
if cargo nextest --version > /dev/null 2>&1; then
  # A test name that matches no integration test is no failure (as under cargo test).
  suite=(cargo nextest run --no-fail-fast --no-tests=pass -p cowboy-tests --test it)
else
  suite=(cargo test --no-fail-fast -p cowboy-tests --test it)
fi
cargo test --workspace --exclude cowboy-tests "$@"
cargo test -p cowboy-tests --lib "$@"
"${suite[@]}" "$@"
COWBOY_TEST_ENGINE=valkey "${suite[@]}" "$@"

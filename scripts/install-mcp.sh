#!/usr/bin/env bash
# Installs the official MCP Python SDK (`mcp` on PyPI) when it is missing: the
# tests drive `cowboy mcp` with it, as a real MCP client would. Pinned, so a
# new SDK release changes the tests only when this line does.
set -euo pipefail
want=2.3.0
python=$(command -v python3 || true)
if [ -z "$python" ]; then
  echo "missing: python3, to install the MCP SDK (pip install mcp==$want)" >&2
  exit 1
fi
have=$("$python" -c "import importlib.metadata as m; print(m.version('mcp'))" 2>/dev/null || true)
[ "$have" = "$want" ] && exit 0
"$python" -m pip install --quiet --disable-pip-version-check "mcp==$want"

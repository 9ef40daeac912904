#!/usr/bin/env bash
# The whole approval loop on one machine, with no accounts: a private redis-server,
# two console bridges (`mail` needs approval, `desk` is where humans are asked),
# an agent's message parked, shown, approved through the CLI, and delivered.
#
# Uses $COWBOY_REDIS_URL when set; otherwise starts redis-server on a free port.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

command -v cargo >/dev/null || { echo "cargo is needed: https://rustup.rs" >&2; exit 1; }
say "building"
cargo build --workspace --quiet
bin=target/debug

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

url=${COWBOY_REDIS_URL:-}
if [ -z "$url" ]; then
  bash scripts/install.sh redis-server=redis-server redis-cli=redis-tools
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 16379)
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
  pids+=($!)
  url="redis://127.0.0.1:$port"
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
  say "private redis-server on $url"
fi

cat >"$work/cowboy.toml" <<TOML
[redis]
url = "$url"

[agents.ann]

[bridges.mail]
type = "console"
output = "$work/mail.out"
input = "$work/mail.in"
destinations = ["*@example.org"]
approval = { required = true, notify = "desk", notify_channel = "ops", timeout = 600, approvers = ["cli:demo", "console:boss"] }

[bridges.desk]
type = "console"
output = "$work/desk.out"
input = "$work/desk.in"
destinations = ["ops"]
TOML
export COWBOY_CONFIG="$work/cowboy.toml"
touch "$work/mail.out" "$work/desk.out"

say "starting the console bridges (mail: outbox; desk: outbox, ingest, ping)"
for svc in "outbox mail" "outbox desk" "ingest desk" "ping desk"; do
  set -- $svc
  RUST_LOG=warn "$bin/cowboy-console-$1" --bridge "$2" &
  pids+=($!)
done

say "agent ann writes to ann:mail:outbox"
"$bin/cowboy" send --bridge mail --agent ann --channel bob@example.org \
  --content "Hi Bob, the report is attached. -- ann" --request-id demo-1

wait_for() { for _ in $(seq 200); do [ -s "$1" ] && return 0; sleep 0.05; done; echo "timed out waiting for $1" >&2; exit 1; }

wait_for "$work/desk.out"
say "the message is parked; desk received this approval request:"
python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["content"])' "$work/desk.out" 2>/dev/null || cat "$work/desk.out"
say "nothing delivered yet: mail.out has $(wc -l <"$work/mail.out") lines"

say "cowboy approvals list"
"$bin/cowboy" approvals list
id=$("$bin/cowboy" approvals list | awk 'NR==1{print $1}')
say "cowboy approvals show ${id:0:8}"
"$bin/cowboy" approvals show "${id:0:8}"
say "cowboy approvals approve ${id:0:8} --as demo"
"$bin/cowboy" approvals approve "${id:0:8}" --as demo

wait_for "$work/mail.out"
say "delivered (mail.out):"
cat "$work/mail.out"
say "cowboy status"
"$bin/cowboy" status
say "demo complete"

"""A real MCP client (the official Python SDK) driven by the Rust tests.

Starts `cowboy-mcp` over stdio with the arguments given after `--`, prints
one JSON line about the session (negotiated protocol version, the newest the
SDK knows, the tools and their input schemas), then carries out one command
per line of standard input and prints one JSON line per answer:

    {"call": "send", "args": {...}, "timeout": 60}
      -> {"is_error": bool, "text": "...", "structured": {...}}
      or {"mcp_error": code, "message": "..."} when the server answers with a
         JSON-RPC error instead of a result
    {"parallel": [command, ...]}
      -> {"answers": [answer, ...]}, the calls made at once

It judges nothing: the Rust test asserts on what it prints.
"""

import asyncio
import json
import sys

from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp_types.version import SUPPORTED_PROTOCOL_VERSIONS


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main():
    argv = sys.argv[sys.argv.index("--") + 1 :]
    server = StdioServerParameters(command=argv[0], args=argv[1:])
    async with Client(server) as client:
        tools = (await client.list_tools()).tools
        say(
            {
                "protocol_version": client.protocol_version,
                "newest_known": max(SUPPORTED_PROTOCOL_VERSIONS),
                "tools": {t.name: t.input_schema for t in tools},
            }
        )
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            cmd = json.loads(line)
            if "parallel" in cmd:
                answers = await asyncio.gather(*(call(client, c) for c in cmd["parallel"]))
                say({"answers": answers})
            else:
                say(await call(client, cmd))


async def call(client, cmd):
    try:
        r = await client.call_tool(
            cmd["call"], cmd.get("args", {}), read_timeout_seconds=cmd.get("timeout", 60)
        )
        return {
            "is_error": bool(r.is_error),
            "text": "".join(getattr(c, "text", "") for c in r.content),
            "structured": r.structured_content,
        }
    except MCPError as e:
        return {"mcp_error": e.code, "message": e.message}


asyncio.run(main())

"""The chaos harness's MCP server: one write tool, not idempotent, whose every effect is counted
per key, so a trial checks "never two effects" at the server, not in Countersign.

`python -m chaos.mcp_upstream --effects FILE --port N [--hang S]` serves streamable HTTP on
127.0.0.1:N at /mcp (the official SDK's server). `write_note(ref, text)` appends one JSON line
`{"ref", "text"}` to FILE (fsynced) and, when `text` starts with "hang", then holds the reply for
S seconds — long enough for the harness to kill the worker while the call is in flight, after
its effect. MCP has no idempotency key, so the harness gives each trial's call a fresh `ref`
and counts the lines that carry it (`effects`).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

TOOL = "write_note"
HANG_PREFIX = "hang"


def build(effects: str, hang_seconds: float) -> MCPServer:
    server = MCPServer("countersign-chaos-notes")

    @server.tool(name=TOOL, description="Write a note (an effect; not idempotent).",
                 annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False))
    def write_note(ref: str, text: str) -> dict:
        with open(effects, "a", encoding="utf-8") as out:
            out.write(json.dumps({"ref": ref, "text": text}) + "\n")
            out.flush()
            os.fsync(out.fileno())
        if text.startswith(HANG_PREFIX):
            time.sleep(hang_seconds)
        return {"ref": ref, "written": True}

    return server


def effects(path: Path, ref: str) -> int:
    """How many effects the server committed for this ref."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return 0
    count = 0
    for line in lines:
        try:
            count += json.loads(line).get("ref") == ref
        except ValueError:
            continue  # a line being written as we read; its ref is another trial's or read next time
    return count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--effects", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hang", type=float, default=3.0)
    args = parser.parse_args()
    build(args.effects, args.hang).run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()

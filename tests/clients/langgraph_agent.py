"""examples/langgraph_refund.py as a process the test can kill. With --hold it stops for good
right after its first proposal, inside the tool node: the call is in the ledger, the step is not
in the checkpoint."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import langgraph_refund  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--url", "--token", "--thread", "--db"):
        parser.add_argument(name, required=True)
    parser.add_argument("--hold", action="store_true")
    args = parser.parse_args()

    def hold(answer: dict) -> None:
        if args.hold:
            langgraph_refund.emit("holding", call_id=answer["call_id"])
            threading.Event().wait()

    langgraph_refund.run(args.url, args.token, args.thread, args.db, on_proposed=hold)


if __name__ == "__main__":
    main()

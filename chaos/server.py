"""`python -m chaos.server <uvicorn args>`: the agent API's server for the chaos harness.

The server dispatches the calls of agents that wait for them itself (ledger/request_dispatch.py),
so the dispatcher's seams run in it too: the seam hook goes in before uvicorn loads the product,
and a trial can freeze the server where it armed one and kill it there (chaos/server_kills.py).
"""

from __future__ import annotations

import sys

from chaos import seams


def main() -> None:
    seams.install()
    print(seams.HOOK_INSTALLED, file=sys.stderr, flush=True)
    from uvicorn.main import main as uvicorn_main

    sys.argv = ["uvicorn", *sys.argv[1:]]
    uvicorn_main()


if __name__ == "__main__":
    main()

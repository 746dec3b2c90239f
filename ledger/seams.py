"""Named points in the dispatcher where a test harness may act on the worker running it.

The dispatcher calls `seam(name, operation_id)` at each point in SEAMS. By default that does
nothing: production never installs a hook, so a seam costs one global lookup. A harness that
needs to freeze a worker at an exact step of the protocol (to kill it, stop it, or let it go)
installs its function with `install(fn)` in the worker process before Celery forks its pool, so
the pool children inherit it. The ledger imports no harness: the harness reaches in, not out.
"""

from __future__ import annotations

from collections.abc import Callable

Hook = Callable[[str, str], None]

# Where the dispatcher calls seam(): inside the claim transaction just before `dispatched`
# commits, and on either side of the provider call.
SEAMS = ("before_dispatch_commit", "before_provider_call", "after_provider_call")

_hook: Hook | None = None


def seam(name: str, operation_id: str) -> None:
    hook = _hook
    if hook is not None:
        hook(name, operation_id)


def install(fn: Hook | None) -> Hook | None:
    """Make `fn(name, operation_id)` run at every seam in this process (None: back to the no-op).
    Returns the hook it replaced, so a caller can put it back."""
    global _hook
    previous, _hook = _hook, fn
    return previous


def installed() -> Hook | None:
    return _hook

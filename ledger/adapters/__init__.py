"""Tool adapters by name. A Tool row names its adapter; the code that talks to the provider
lives here."""

from __future__ import annotations

from ledger.adapters.base import Adapter
from ledger.adapters.mail import MailAdapter
from ledger.adapters.noop import NoopAdapter
from ledger.adapters.payments import OrderLookupAdapter, RefundAdapter

ADAPTERS: dict[str, Adapter] = {
    adapter.name: adapter
    for adapter in (RefundAdapter(), OrderLookupAdapter(), MailAdapter(), NoopAdapter())
}


def get_adapter(name: str) -> Adapter:
    try:
        return ADAPTERS[name]
    except KeyError:
        raise LookupError(f"No adapter named {name!r}; known: {', '.join(sorted(ADAPTERS))}") from None

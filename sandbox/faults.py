"""Magic values and fault selection, shared by every sandbox provider.

A value that contains ``fault-<name>`` faults the first request for its idempotency key;
``fault-<name>-always`` faults every request. ``fault-opaque`` is always "always": its whole point
is that the provider can never tell the caller what happened to that key.
"""

from __future__ import annotations

from dataclasses import dataclass

# Order matters only for values carrying several names: the first match wins.
FAULTS: tuple[str, ...] = (
    "timeout-after-commit",
    "timeout-before-commit",
    "lost-reply",
    "429",
    "5xx-before-commit",
    "5xx-after-commit",
    "crash",
    "opaque",
)

# Faults that end the request before anything is committed: no effect, ever.
BEFORE_COMMIT: frozenset[str] = frozenset({"429", "5xx-before-commit", "timeout-before-commit"})
# Faults that strike after the effect (or the stored known failure) is durably committed.
AFTER_COMMIT: frozenset[str] = frozenset(
    {"timeout-after-commit", "lost-reply", "5xx-after-commit", "crash", "opaque"}
)

TARGETS: tuple[str, ...] = ("writes", "reads", "all")


@dataclass(frozen=True)
class MagicFault:
    name: str
    always: bool


def parse_magic(value: object) -> MagicFault | None:
    """The fault a magic value asks for, or None for an ordinary value."""
    if not isinstance(value, str):
        return None
    lowered = value.lower()
    for name in FAULTS:
        token = f"fault-{name}"
        if token in lowered:
            return MagicFault(name=name, always=name == "opaque" or f"{token}-always" in lowered)
    return None


def normalize_fault_name(value: str) -> str:
    """Accept ``429`` as well as ``fault-429`` from the control endpoint; raise on anything else."""
    name = value.removeprefix("fault-")
    if name not in FAULTS:
        raise ValueError(f"unknown fault {value!r}; known: {', '.join(FAULTS)}")
    return name


def magic_fault_for_attempt(magic: MagicFault | None, attempt: int) -> str | None:
    """Magic values fault the first attempt for a key only, unless they say ``-always``."""
    if magic is None:
        return None
    if magic.always or attempt == 1:
        return magic.name
    return None

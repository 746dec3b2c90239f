"""Typed environment variables: a bad value stops start-up with a message naming the variable."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import TypeVar

from django.core.exceptions import ImproperlyConfigured

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _read(name: str, default: T, parse: Callable[[str], T], expected: str) -> T:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return parse(raw.strip())
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(
            f"Environment variable {name}={raw!r} is invalid: expected {expected} ({exc})."
        ) from exc


def env_str(name: str, default: str = "") -> str:
    return _read(name, default, str, "a string")


def env_bool(name: str, default: bool) -> bool:
    def parse(raw: str) -> bool:
        lowered = raw.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ValueError(f"not one of {sorted(_TRUE | _FALSE - {''})}")

    return _read(name, default, parse, "a boolean (true/false)")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    def parse(raw: str) -> int:
        value = int(raw)
        if minimum is not None and value < minimum:
            raise ValueError(f"must be >= {minimum}")
        if maximum is not None and value > maximum:
            raise ValueError(f"must be <= {maximum}")
        return value

    return _read(name, default, parse, "an integer")


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    def parse(raw: str) -> float:
        value = float(raw)
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        if minimum is not None and value < minimum:
            raise ValueError(f"must be >= {minimum}")
        return value

    return _read(name, default, parse, "a number")


def env_list(name: str, default: list[str]) -> list[str]:
    return _read(
        name, default, lambda raw: [item.strip() for item in raw.split(",") if item.strip()],
        "a comma-separated list",
    )


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    def parse(raw: str) -> str:
        if raw not in choices:
            raise ValueError(f"not one of {', '.join(choices)}")
        return raw

    return _read(name, default, parse, f"one of {', '.join(choices)}")


def env_url(name: str, default: str, *, schemes: tuple[str, ...]) -> str:
    def parse(raw: str) -> str:
        scheme = raw.split("://", 1)[0] if "://" in raw else ""
        if scheme not in schemes:
            raise ValueError(f"scheme must be one of {', '.join(schemes)}")
        return raw

    return _read(name, default, parse, f"a URL ({'/'.join(schemes)})")

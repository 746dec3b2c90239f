"""new_id: `prefix_` + a lower-case ULID, in the format and order of the IDs already stored."""

from __future__ import annotations

import re

from console.lib import ids

CROCKFORD_LOWER = "0123456789abcdefghjkmnpqrstvwxyz"


def crockford(value: int, length: int) -> str:
    """How IDs were written before python-ulid: big-endian base32, lower-case Crockford."""
    chars = []
    for _ in range(length):
        value, rem = divmod(value, 32)
        chars.append(CROCKFORD_LOWER[rem])
    return "".join(reversed(chars))


def test_an_id_is_the_prefix_and_26_lower_case_crockford_characters():
    value = ids.new_id("apr")
    assert re.fullmatch(r"apr_[0-9a-hjkmnp-tv-z]{26}", value)


def test_the_first_ten_characters_are_the_millisecond_timestamp_as_before(monkeypatch):
    millis = 1_764_000_000_123
    monkeypatch.setattr(ids._ULIDS, "clock", lambda: millis)
    assert ids.new_id("op")[3:13] == crockford(millis, 10)


def test_ids_sort_by_creation_time_and_do_not_repeat(monkeypatch):
    clock = iter(range(1_700_000_000_000, 1_700_000_000_000 + 10_000, 7))
    monkeypatch.setattr(ids._ULIDS, "clock", lambda: next(clock))
    made = [ids.new_id("call") for _ in range(1000)]
    assert made == sorted(made)
    assert len(set(made)) == len(made)


def test_ids_made_within_one_millisecond_differ_in_their_random_part(monkeypatch):
    monkeypatch.setattr(ids._ULIDS, "clock", lambda: 1_700_000_000_000)
    made = {ids.new_id("x")[12:] for _ in range(100)}
    assert len(made) == 100


def test_a_new_id_sorts_after_one_written_by_the_old_encoder_earlier():
    old = "apr_" + crockford(1_700_000_000_000, 10) + crockford(2**80 - 1, 16)
    assert ids.new_id("apr") > old

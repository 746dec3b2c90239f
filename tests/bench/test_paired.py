"""The paired measurement (bench/paired.py): both kinds of clients start together and take turns
in ABBA blocks, one ratio per block. A client that fails stops the run with its own error."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from django.db import connection

from bench import paired


def test_each_block_rates_each_kind_over_its_own_two_slices():
    # Kind 0 ran slices A…A of two blocks, kind 1 the B B between them.
    ops = [[100, 300, 50, 50], [200, 200, 10, 30]]
    durations = [[1.0, 1.0, 0.5, 0.5], [2.0, 2.0, 1.0, 1.0]]
    assert paired.block_rates(ops, durations) == [(200.0, 100.0), (100.0, 20.0)]


def test_the_ratio_is_the_median_of_the_blocks_ratios():
    pair = paired.Paired(kinds=("a", "b"), clients=1, slice_seconds=0.1,
                         blocks=[(1.0, 2.0), (3.0, 1.0), (2.0, 2.0)], cpu_ms_per_op=(0.0, 0.0), p50_ms=(0.0, 0.0),
                         p99_ms=(0.0, 0.0))
    assert pair.ratios == [0.5, 3.0, 1.0]
    assert pair.ratio == 1.0


pg_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="the bench's clients measure PostgreSQL")


def url() -> str:
    # As DATABASE_URL gives it: each client process sets Django up from it.
    s = connection.settings_dict
    password = f":{quote(s['PASSWORD'], safe='')}" if s["PASSWORD"] else ""
    return f"postgres://{quote(s['USER'], safe='')}{password}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pg_only
@pytest.mark.django_db(transaction=True)
def test_a_paired_run_measures_every_block_of_both_kinds():
    pair = paired.run(("roundtrip", "roundtrip"), 2, slice_seconds=0.05, blocks=3, url=url(), dbos_url="",
                      seal_every=None)
    assert len(pair.blocks) == 3
    assert all(a > 0 and b > 0 for a, b in pair.blocks)
    assert pair.cpu_ms_per_op[0] > 0 and pair.cpu_ms_per_op[1] > 0


@pg_only
@pytest.mark.django_db(transaction=True)
def test_a_client_that_fails_stops_the_run_with_its_error():
    with pytest.raises(RuntimeError, match="ValueError: no such kind"):
        paired.run(("roundtrip", "no such kind"), 1, slice_seconds=0.05, blocks=1, url=url(), dbos_url="",
                   seal_every=None)

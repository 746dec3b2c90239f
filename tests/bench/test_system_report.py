"""The whole-system bench's report (bench/system.py): with several rounds, the ratio to DBOS is
the median of each round's own ratio, and a system's best agent count is read from its median
rate over the rounds."""

from __future__ import annotations

from bench import procstat, system


def point(name: str, agents: int, per_s: int, round_: int) -> system.Point:
    calls = [{"order_id": f"o{i}", "status": "confirmed", "latency": 0.01, "in_window": True} for i in range(per_s)]
    return system.Point(name, 1, 1, agents, 1.0, "0.0", calls, round=round_)


def test_the_ratio_is_the_median_of_the_rounds_ratios(capsys):
    system.report([
        point("countersign", 16, 100, 0), point("dbos", 16, 200, 0),  # 0.50
        point("dbos", 16, 100, 1), point("countersign", 16, 150, 1),  # 1.50
        point("countersign", 16, 120, 2), point("dbos", 16, 100, 2),  # 1.20
    ])
    out = capsys.readouterr().out
    assert "median of 3 rounds" in out
    assert "agents=16:   120.0 /   100.0 =  1.20 (0.50–1.50)" in out
    assert "÷ = 1.20" in out  # at saturation, the medians' ratio
    assert "met in 1 of 1 cells" in out


def test_the_best_agent_count_is_the_one_with_the_best_median_rate(capsys):
    system.report([
        point("countersign", 1, 50, 0), point("countersign", 1, 300, 1), point("countersign", 1, 60, 2),
        point("countersign", 16, 100, 0), point("countersign", 16, 90, 1), point("countersign", 16, 110, 2),
    ])
    assert "countersign 100.0/s (agents=16" in capsys.readouterr().out


def test_one_round_reads_as_before(capsys):
    system.report([point("countersign", 8, 90, 0), point("dbos", 8, 100, 0)])
    out = capsys.readouterr().out
    assert "rounds" not in out
    assert "agents= 8:    90.0 /   100.0 =  0.90   p99" in out
    assert "met in 0 of 1 cells" in out


def test_a_process_sample_counts_the_switches_of_every_thread():
    """/proc/PID/status counts the main thread's switches only; a server's work is in its
    other threads."""
    import os
    import threading
    import time

    napped, release = threading.Event(), threading.Event()

    def naps() -> None:
        for _ in range(50):
            time.sleep(0.001)  # each sleep gives the core up: a voluntary switch
        napped.set()
        release.wait()

    thread = threading.Thread(target=naps)
    before = procstat.process_sample(os.getpid())
    thread.start()
    try:
        assert napped.wait(10)
        after = procstat.process_sample(os.getpid())
    finally:
        release.set()
        thread.join()

    assert after[1] - before[1] >= 50
    assert after[0] >= before[0]


def test_what_postgres_spent_leaves_out_a_process_that_ended_and_counts_a_new_one_whole():
    before = {1: (2.0, 10, 1), 2: (5.0, 50, 5)}
    after = {1: (2.5, 14, 2), 3: (0.25, 3, 0)}  # 2 ended, 3 started

    assert procstat.spent(before, after) == (0.75, 7, 1)

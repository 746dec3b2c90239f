"""Every benchmark starts as the README runs it: `python bench/<name>.py`. Run as a script, the
folder `bench/` comes first on the path, so a top-level import of a product module (or one
that needs Django set up) breaks the script while imports from tests still work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(path for path in (ROOT / "bench").glob("*.py") if "argparse" in path.read_text())


def test_the_benchmarks_are_found():
    assert {path.name for path in SCRIPTS} >= {"ledger.py", "inbox.py", "otlp.py", "latency.py", "system.py"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_each_benchmark_starts_as_a_script(script: Path):
    done = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout

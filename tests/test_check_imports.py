"""The layering check (`scripts/check_imports.py`, run by `make lint` in CI) finds the knots it
is for, and the product has none."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("check_imports", ROOT / "scripts" / "check_imports.py")
check_imports = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_imports)


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    for package in check_imports.PACKAGES:
        (root / package).mkdir(exist_ok=True)
        (root / package / "__init__.py").touch()
    return root


def test_the_product_has_no_cycle_across_packages_and_no_hidden_import():
    assert check_imports.findings(ROOT) == []


def test_it_finds_a_cycle_that_spans_two_packages(tmp_path):
    root = write(tmp_path, {
        "runs/services.py": "from ledger import services\n",
        "ledger/services.py": "from runs.services import x\n",
    })
    [finding] = check_imports.findings(root)
    assert finding == "import cycle across packages: ledger.services -> runs.services"


def test_a_cycle_inside_one_package_is_that_package_s_business(tmp_path):
    root = write(tmp_path, {
        "ledger/a.py": "from ledger import b\n",
        "ledger/b.py": "from ledger.a import x\n",
    })
    assert check_imports.findings(root) == []


@pytest.mark.parametrize("body", [
    "def f():\n    from runs.models import Task\n",
    "def f():\n    import runs.models\n",
    "class C:\n    def m(self):\n        from runs import models\n",
])
def test_it_finds_a_function_local_import_of_another_package(tmp_path, body):
    root = write(tmp_path, {"ledger/x.py": body, "runs/models.py": ""})
    [finding] = check_imports.findings(root)
    assert "function-local import of runs.models crosses from ledger to runs" in finding


def test_a_function_local_import_within_the_package_is_allowed(tmp_path):
    root = write(tmp_path, {"ledger/x.py": "def f():\n    from ledger import y\n", "ledger/y.py": ""})
    assert check_imports.findings(root) == []


def test_it_follows_relative_imports(tmp_path):
    root = write(tmp_path, {
        "runs/a.py": "from . import b\n",
        "runs/b.py": "from ledger import c\n",
        "ledger/c.py": "from runs.a import x\n",
    })
    [finding] = check_imports.findings(root)
    assert finding == "import cycle across packages: ledger.c -> runs.a -> runs.b"

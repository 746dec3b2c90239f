"""Fails when the product's packages are tied in a knot.

Two rules, read from the source with `ast` (nothing is imported or run):
1. No module import cycle spans two packages: the strongly connected components of the
   module import graph each stay inside one top-level package.
2. No function-local import names another package: an import inside a function hides a
   dependency (usually a cycle in disguise); cross-package imports go at the top of the module.

Type-checking-only imports count like any other: a layer that needs another's names for its
annotations depends on it.

Usage: python scripts/check_imports.py [ROOT]   (exit status 1 and one line per finding)
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGES = ("console", "runs", "approvals", "ledger", "sandbox", "chaos")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path) -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" not in path.parts:
                modules[module_name(root, path)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of a dotted name that is a project module."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path, importer: str, modules: dict[str, Path]) -> Iterator[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every project import in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    local: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    local.add(id(inner))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, importer, is_package)
            # `from package import module` names a module; `from module import name` does not.
            names = [f"{base}.{alias.name}" for alias in node.names] or [base]
        else:
            continue
        for name in names:
            target = _resolve(name, modules)
            if target is not None and target != importer:
                yield target, node.lineno, id(node) in local


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (the graph is small, but recursion limits are not ours to trust)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def package_of(module: str) -> str:
    return module.split(".", 1)[0]


def findings(root: Path) -> list[str]:
    modules = project_modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    problems = []
    for name, path in modules.items():
        for target, line, inside_function in sorted(set(imports_of(path, name, modules))):
            graph[name].add(target)
            if inside_function and package_of(target) != package_of(name):
                problems.append(f"{path.relative_to(root)}:{line}: function-local import of {target} "
                                f"crosses from {package_of(name)} to {package_of(target)}")
    for component in strongly_connected(graph):
        if len({package_of(m) for m in component}) > 1:
            problems.append("import cycle across packages: " + " -> ".join(component))
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parent.parent)
    problems = findings(root)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} layering problem(s); docs/architecture.md says which way layers point.")
        return 1
    print("imports: no cycle spans two packages, no function-local import crosses packages")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

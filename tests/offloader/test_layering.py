"""The import structure of include/: no import cycle anywhere, and offloader's layers
(pyproject.toml, [tool.importlinter]) kept: a lower layer never imports a higher one.

Every import counts, also those inside functions and under ``if TYPE_CHECKING:``: a
dependency hidden in a function is still a dependency. A failure names the modules of
each cycle with the import lines that close it, or import-linter's account of each import
that goes upward.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.source_tree

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "include"


def include_modules() -> dict[str, Path]:
    """Every module under include/: the offloader package by dotted name, the Spark
    applications (spark-submit puts them side by side) by file name."""
    found = {}
    for path in sorted((INCLUDE / "offloader").rglob("*.py")):
        parts = path.relative_to(INCLUDE).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in sorted((INCLUDE / "spark_jobs").glob("*.py")):
        found[path.stem] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import statement of module ``name``, wherever it
    stands. An import names the deepest module it loads (``from a import b`` is module
    ``a.b`` if there is one, else ``a``), as Python's own cycle errors see it; modules
    outside include/ are left out."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            targets = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t if t in known else base for t in targets]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target, node.lineno


Cycle = list[tuple[str, str, int]]  # (importer, imported, line), the last imports the first


def import_cycles(known: dict[str, Path]) -> list[tuple[list[str], Cycle]]:
    """Each group of modules that import each other (a strongly connected component of the
    import graph), with one shortest cycle through its first module."""
    edges: dict[str, dict[str, int]] = {name: {} for name in known}
    for name, path in known.items():
        for target, line in imports_of(name, path, known):
            edges[name].setdefault(target, line)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(edges[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(known):
        if module not in index:
            visit(module)
    return [(group, _shortest_cycle(group, edges)) for group in sorted(groups)]


def _shortest_cycle(group: list[str], edges: dict[str, dict[str, int]]) -> Cycle:
    start, members = group[0], set(group)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for target in sorted(edges[module]):
            if target == start:
                chain = [module]
                while chain[-1] != start:
                    chain.append(came_from[chain[-1]])
                chain.reverse()
                ends = [*chain[1:], start]
                return [(a, b, edges[a][b]) for a, b in zip(chain, ends, strict=True)]
            if target in members and target not in came_from:
                came_from[target] = module
                queue.append(target)
    raise AssertionError(f"no cycle through {start} in {group}")


def describe_cycles(cycles: list[tuple[list[str], Cycle]], known: dict[str, Path]) -> str:
    lines = [f"{len(cycles)} group(s) of modules in include/ import each other:"]
    for group, cycle in cycles:
        lines.append(f"- {', '.join(group)}; a cycle among them:")
        lines += [f"    {a} -> {b}  ({known[a].relative_to(ROOT)}:{line})" for a, b, line in cycle]
    return "\n".join(lines)


def test_no_import_cycle_in_include() -> None:
    known = include_modules()
    assert "offloader.keys" in known and "offloader_app" in known
    cycles = import_cycles(known)
    assert not cycles, describe_cycles(cycles, known)


def test_offloader_keeps_its_layers() -> None:
    """import-linter's layers contract (pyproject.toml), on this checkout's include/."""
    path = [str(INCLUDE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
            "--config",
            "pyproject.toml",
            "--no-cache",
            "--no-logo",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"Contracts: [1-9]\d* kept, 0 broken", done.stdout), done.stdout

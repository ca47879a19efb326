"""mutmut's verdicts kept in the repository, so mutation testing carries over between machines.

mutmut keeps a verdict per mutant, and the hash of every mutated function, in ``.meta``
files beside its mutated copy; a later run re-tests only the mutants of functions whose
hash changed. Those files live in ``var/`` and die with the machine, while a whole run
takes hours on a 2-core VM. ``mutation/results.json`` holds the same facts in a
compact form: per module and function, the hash, the exit codes of its mutants (mutant
``N`` at index ``N - 1``; ``null`` for one not yet tested) and the run that produced
them. ``seed`` writes ``.meta`` files from it into an empty staging directory, so mutmut
itself decides what is still valid; ``record`` folds a run's verdicts back in.

A kept verdict is valid as long as the function's source is unchanged, the rule mutmut
applies itself. mutmut keys it by module and function, so a function moved unchanged to
another module or class would lose it; ``carry_moved`` hands it over, by the same hash (a
function's mutants depend on nothing but its syntax tree), and drops the verdicts of
modules and functions that are gone. Tests that got weaker are not detected: ``make mutate
FRESH=1`` ignores the file and starts over.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "mutation" / "results.json"
INTERRUPTED = 2  # mutmut's exit code for "check was interrupted by user"
_MUTANT = re.compile(r"^(?P<func>.+)__mutmut_(?P<n>\d+)$")

# {module path: {function: {"hash": str, "codes": [int | None], "run": str | None}}}
Functions = dict[str, dict[str, dict]]


@dataclass
class Cache:
    runs: dict[str, dict[str, str]]
    modules: Functions

    @classmethod
    def load(cls, path: Path = CACHE) -> Cache:
        if not path.exists():
            return cls({}, {})
        data = json.loads(path.read_text())
        return cls(data["runs"], data["modules"])

    def save(self, path: Path = CACHE) -> None:
        used = {f["run"] for funcs in self.modules.values() for f in funcs.values()}
        runs = {k: v for k, v in sorted(self.runs.items()) if k in used}
        # one function a line: diffs stay readable, the file small
        lines = ["{", f'  "runs": {json.dumps(runs, sort_keys=True)},', '  "modules": {']
        modules = sorted(self.modules.items())
        for i, (module, funcs) in enumerate(modules):
            lines.append(f"    {json.dumps(module)}: {{")
            items = sorted(funcs.items())
            for j, (name, entry) in enumerate(items):
                comma = "," if j + 1 < len(items) else ""
                entry_json = json.dumps(entry, sort_keys=True)
                lines.append(f"      {json.dumps(name)}: {entry_json}{comma}")
            lines.append("    }" + ("," if i + 1 < len(modules) else ""))
        lines += ["  }", "}", ""]
        path.write_text("\n".join(lines))

    def statuses(self) -> dict[str, dict[str, int | None]]:
        """{module path: {mutant name: exit code}}, as mutmut's ``.meta`` files hold them."""
        return {module: _exit_codes(module, funcs) for module, funcs in self.modules.items()}


def without_stale(cache: Cache, source: Path) -> Cache:
    """``cache`` with the verdicts of every function whose source under ``source`` has
    changed (or is gone) set to None, by mutmut's own function hash."""
    modules: Functions = {}
    for module, funcs in cache.modules.items():
        path = source / module
        current = compute_hashes(path) if path.exists() else {}
        modules[module] = {
            func: entry
            if current.get(func) == entry["hash"]
            else {**entry, "codes": [None] * len(entry["codes"])}
            for func, entry in funcs.items()
        }
    return Cache(cache.runs, modules)


@dataclass(frozen=True)
class Moves:
    """What :func:`carry_moved` did: the cache after it, the mutant-name prefixes it renamed
    (``<old module>.<old function>__mutmut_`` -> the new one) and what it dropped."""

    cache: Cache
    renamed: dict[str, str]
    dropped: list[str]


def mutated_modules(source: Path, pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The module paths under ``source`` that ``[tool.mutmut] only_mutate`` names."""
    globs = tomllib.loads(pyproject.read_text())["tool"]["mutmut"]["only_mutate"]
    return sorted(
        {
            str(path.relative_to(source))
            for glob in globs
            for path in source.glob(glob.removeprefix("src/"))
            if path.suffix == ".py"
        }
    )


def carry_moved(cache: Cache, source: Path, modules: Iterable[str]) -> Moves:
    """``cache`` with the verdicts of every function that moved unchanged handed to its new
    place, and the verdicts of modules and functions no longer in ``source`` dropped.

    A function of ``modules`` without a kept verdict for its current source takes the
    verdicts of the kept function with the same hash (mutmut's: of the whole syntax tree,
    name and body) that is no longer where it was kept. Where several such functions share
    the hash with different verdicts, none is taken: the function is tested again.
    """
    current = {
        module: compute_hashes(source / module)
        for module in {*modules, *cache.modules}
        if (source / module).exists()
    }
    moved_away: dict[str, list[tuple[str, str, dict]]] = {}
    for module, funcs in cache.modules.items():
        for func, entry in funcs.items():
            if current.get(module, {}).get(func) != entry["hash"] and any(
                code is not None for code in entry["codes"]
            ):
                moved_away.setdefault(entry["hash"], []).append((module, func, entry))
    kept: Functions = {}
    renamed: dict[str, str] = {}
    for module in sorted(current):
        for func, digest in current[module].items():
            entry = cache.modules.get(module, {}).get(func)
            if entry is None or entry["hash"] != digest:
                donors = moved_away.get(digest, [])
                if len({json.dumps(d[2]["codes"]) for d in donors}) == 1:
                    old_module, old_func, entry = donors[0]
                    old = f"{_module_name(old_module)}.{old_func}__mutmut_"
                    renamed[old] = f"{_module_name(module)}.{func}__mutmut_"
            if entry is not None:
                kept.setdefault(module, {})[func] = entry
    dropped = sorted(
        f"{_module_name(module)}.{func}"
        for module, funcs in cache.modules.items()
        for func in funcs
        if func not in kept.get(module, {})
    )
    return Moves(Cache(cache.runs, kept), renamed, dropped)


def compute_hashes(path: Path) -> dict[str, str]:
    """mutmut's hash of every function in ``path``, keyed as its mutant names are."""
    from mutmut.mutation.file_mutation import compute_function_hashes

    return compute_function_hashes(path.read_text())


def rename_notes(text: str, renamed: dict[str, str]) -> str:
    """The survivor notes' file (``["<mutant name>"]`` tables) with each table of a renamed
    function under its new name; everything else, comments and order, as it was."""
    lines = []
    for line in text.splitlines(keepends=True):
        if line.startswith('["'):
            name = line[2 : line.index('"]')]
            head, sep, number = name.rpartition("__mutmut_")
            new = renamed.get(head + sep)
            if new is not None:
                line = line.replace(name, new + number, 1)
        lines.append(line)
    return "".join(lines)


def _module_name(module: str) -> str:
    """``offloader/gc/sweep.py`` -> ``offloader.gc.sweep`` (mutmut's prefix of mutant names)."""
    return module.removesuffix(".py").replace("/", ".").removesuffix(".__init__")


def _exit_codes(module: str, funcs: dict[str, dict]) -> dict[str, int | None]:
    prefix = _module_name(module)
    return {
        f"{prefix}.{func}__mutmut_{n}": code
        for func, entry in funcs.items()
        for n, code in enumerate(entry["codes"], start=1)
    }


def _meta_path(stage: Path, module: str) -> Path:
    return stage / "mutants" / "src" / (module + ".meta")


def seed(stage: Path, cache: Cache) -> int:
    """Write a ``.meta`` file for every cached module the staging directory lacks."""
    written = 0
    for module, funcs in cache.modules.items():
        meta = _meta_path(stage, module)
        if meta.exists():
            continue
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(
            json.dumps(
                {
                    "exit_code_by_key": _exit_codes(module, funcs),
                    "hash_by_function_name": {f: e["hash"] for f, e in funcs.items()},
                    "type_check_error_by_key": {},
                    "durations_by_key": {},
                    "estimated_durations_by_key": {},
                }
            )
        )
        written += 1
    return written


def read_stage(stage: Path) -> Functions:
    """The staging directory's verdicts, grouped by function (without provenance)."""
    base = stage / "mutants" / "src"
    modules: Functions = {}
    for meta in sorted(base.rglob("*.py.meta")):
        data = json.loads(meta.read_text())
        module = str(meta.relative_to(base)).removesuffix(".meta")
        funcs: dict[str, dict] = {
            f: {"hash": h, "codes": [], "run": None}
            for f, h in data.get("hash_by_function_name", {}).items()
        }
        for key, code in data["exit_code_by_key"].items():
            match = _MUTANT.match(key.rpartition(".")[2])
            if match is None:
                continue
            func, n = match["func"], int(match["n"])
            entry = funcs.setdefault(func, {"hash": None, "codes": [], "run": None})
            codes = entry["codes"]
            codes.extend([None] * (n - len(codes)))
            # a mutant whose check was interrupted (exit code 2) has no verdict: test it again
            codes[n - 1] = None if code == INTERRUPTED else code
        if any(entry["codes"] for entry in funcs.values()):
            modules[module] = {f: e for f, e in funcs.items() if e["codes"]}
    return modules


def run_id(command: str) -> tuple[str, dict[str, str]]:
    """An id and a description of the run happening now, on this commit and machine."""
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    if _git("status", "--porcelain", "--", "include", "tests"):
        commit += "+uncommitted"
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    key = f"{now:%Y-%m-%dT%H:%M:%SZ} {commit}"
    return key, {
        "commit": commit,
        "date": now.date().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "command": command,
    }


def record(
    cache: Cache, before: Functions, after: Functions, selected: list[str], command: str
) -> Cache:
    """``cache`` with the verdicts of a run that turned ``before`` into ``after``.

    A function's verdicts belong to this run when the run tested any of its mutants: its
    source changed, a verdict changed, or a mutant was named by ``selected`` (mutmut
    re-tests named mutants even when it had a verdict). Otherwise the cached run stays.
    """
    key, description = run_id(command)
    base, n = key, 1
    while key in cache.runs:  # two runs within a second
        n += 1
        key = f"{base} #{n}"
    modules: Functions = {}
    for module, funcs in after.items():
        name = _module_name(module)
        kept = cache.modules.get(module, {})
        modules[module] = {}
        for func, entry in funcs.items():
            old = before.get(module, {}).get(func)
            touched = (
                old is None
                or old["hash"] != entry["hash"]
                or old["codes"] != entry["codes"]
                or any(
                    fnmatch(f"{name}.{func}__mutmut_{n}", glob)
                    for glob in selected
                    for n in range(1, len(entry["codes"]) + 1)
                )
            )
            run = kept.get(func, {}).get("run")
            if all(code is None for code in entry["codes"]):
                run = None
            elif touched or run is None:
                run = key
            modules[module][func] = {**entry, "run": run}
    return Cache({**cache.runs, key: description}, modules)


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""

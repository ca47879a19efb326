"""Mutation testing with mutmut: `make mutate` (every configured module) and `make mutate-smoke`.

mutmut derives a mutant's module name from its file path and strips only a leading
``src/``; the library lives in ``include/`` and is also installed editable from another
checkout. So mutmut runs in a staging directory, ``var/mutation/<profile>/``, where
``src`` links to ``include/`` (modules are named ``offloader.…`` as the tests import
them) and ``tests``, ``benchmarks`` and ``pyproject.toml`` link to the repo's. The child
processes get ``PYTHONPATH=<stage>/mutants/src``, so even a subprocess imports the mutated
copy, never the editable install. The configuration is ``[tool.mutmut]`` in pyproject.toml.

``make mutate`` starts from the verdicts kept in mutation/results.json
(scripts/mutation_cache.py) and folds its own back in, so a clean clone on a new machine
tests only the mutants of functions changed since the recorded runs; ``--fresh`` forgets
both the staging directory and that file's verdicts.

The smoke run proves the setup on a small, bounded set of mutants: it must kill at least
one mutant of ``offloader/keys.py``, report none as suspicious or without tests, and kill
the mutant that inverts the CAS row-count check in ``metadata/_rows.py``.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import resource
import shutil
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import mutation_cache
import mutation_report
from mutation_report import load_results, print_table  # scripts/ is on sys.path when run

ROOT = Path(__file__).resolve().parent.parent
# staging name -> repo path
LINKS = {name: name for name in ("tests", "benchmarks", "pyproject.toml")} | {"src": "include"}
SMOKE_GLOB = "offloader.keys.*"
# The smoke run's tests: enough to cover every function of keys.py and ``cas``. mutmut runs
# its whole selection twice before the first mutant, so the full fast selection would make
# the CI step take longer than the suite itself.
SMOKE_TESTS = (
    "tests/offloader/test_keys.py",
    "tests/offloader/offload/test_object_metadata.py",
    "tests/offloader/offload/test_offload_recovery.py",
    "tests/offloader/gc/test_sweep.py",
    "tests/offloader/metadata/test_offload_attempts.py",
)
# A mutant that turns a bounded loop into an endless one can grow without limit; mutmut only
# limits CPU time. Past this address-space size the test fails with MemoryError (a kill).
MEMORY_LIMIT_BYTES = 8 << 30
RETEST = {"survived", "no tests", "suspicious", "timeout", "segfault"}
CACHE_NAME = str(mutation_cache.CACHE.relative_to(ROOT))
BAD_STATUSES = {"suspicious", "no tests", "not checked", "segfault"}
# past this many mutant names, the printed command and the recorded run give their count
NAMES_SHOWN = 8


def stage_dir(profile: str, fresh: bool, tests: tuple[str, ...] = ()) -> Path:
    """The staging directory for ``profile``; ``fresh`` drops earlier results first.

    ``tests`` replaces ``[tool.mutmut]``'s test selection in the profile's own copy of
    pyproject.toml (otherwise the repo's file is linked).
    """
    stage = ROOT / "var" / "mutation" / profile
    if fresh and stage.exists():
        shutil.rmtree(stage)
    # exist before Python starts: a PYTHONPATH entry missing then is never looked at again
    for folder in ("src", "tests"):
        (stage / "mutants" / folder).mkdir(parents=True, exist_ok=True)
    for name, target in LINKS.items():
        link = stage / name
        if name == "pyproject.toml" and tests:
            link.unlink(missing_ok=True)
            link.write_text(with_test_selection((ROOT / target).read_text(), tests))
        elif not link.is_symlink():
            link.symlink_to(ROOT / target)
    return stage


def with_test_selection(pyproject: str, tests: tuple[str, ...]) -> str:
    """``pyproject`` with ``pytest_add_cli_args_test_selection`` set to ``tests``."""
    pattern = re.compile(r"^pytest_add_cli_args_test_selection = \[.*?^\]$", re.M | re.S)
    selection = "pytest_add_cli_args_test_selection = [" + ", ".join(f'"{t}"' for t in tests) + "]"
    text, count = pattern.subn(selection, pyproject)
    if count != 1:
        sys.exit("mutation: pyproject.toml has no pytest_add_cli_args_test_selection list")
    return text


def limit_memory() -> None:
    """Run in mutmut's process before it starts: its forked children inherit the limit."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def stage_env(stage: Path) -> dict[str, str]:
    """The environment mutmut and its test processes run in: only the mutated copy."""
    env = {k: v for k, v in os.environ.items() if k != "MUTANT_UNDER_TEST"}
    # src: the mutated library; tests: the fast_selection plugin that [tool.mutmut] loads
    env["PYTHONPATH"] = os.pathsep.join(str(stage / "mutants" / d) for d in ("src", "tests"))
    env["HYPOTHESIS_PROFILE"] = "mutation"  # tests/fixtures/hypothesis_profiles.py
    return env


def check_imports_mutated_copy(stage: Path) -> None:
    """A process started like mutmut's children imports offloader from the staging copy."""
    done = subprocess.run(
        [sys.executable, "-c", "import offloader; print(offloader.__file__)"],
        cwd=stage,
        env=stage_env(stage),
        capture_output=True,
        text=True,
        check=True,
    )
    imported = Path(done.stdout.strip()).resolve()
    expected = (stage / "mutants" / "src" / "offloader").resolve()
    if expected not in imported.parents:
        sys.exit(f"mutation: offloader imported from {imported}, not from {expected}")


def run_mutmut(stage: Path, max_children: int, names: list[str]) -> None:
    mutmut = Path(sys.executable).with_name("mutmut")
    command = [str(mutmut), "run", "--max-children", str(max_children), *names]
    shown = (
        command[1:]
        if len(names) <= NAMES_SHOWN
        else [*command[1:4], *names[:3], f"... {len(names)} names"]
    )
    print(f"mutation: {' '.join(shown)} (in {stage.relative_to(ROOT)})", flush=True)
    done = subprocess.run(command, cwd=stage, env=stage_env(stage), preexec_fn=limit_memory)
    if done.returncode != 0:
        sys.exit(f"mutation: mutmut exited with status {done.returncode}")


def cas_inversion_mutant(stage: Path) -> str:
    """The mutant of ``cas`` whose row-count check reads ``== 1`` instead of ``!= 1``."""
    path = stage / "mutants" / "src" / "offloader" / "metadata" / "_rows.py"
    source = path.read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("x_cas__mutmut_"):
            segment = ast.get_source_segment(source, node) or ""
            if "result.rowcount == 1" in segment:
                suffix = node.name.removeprefix("x_cas__mutmut_")
                if suffix.isdigit():
                    return f"offloader.metadata._rows.{node.name}"
    sys.exit(f"mutation: no mutant of cas inverts the row-count check in {path}")


def smoke(stage: Path, max_children: int) -> None:
    """A bounded run that fails loudly when the setup, not the tests, is broken."""
    run_mutmut(stage, max_children, [SMOKE_GLOB])
    check_imports_mutated_copy(stage)
    cas = cas_inversion_mutant(stage)
    run_mutmut(stage, max_children, [cas])
    results = load_results(stage)
    statuses = {name: status for module in results.values() for name, status in module.items()}
    keys = {n: s for n, s in statuses.items() if n.startswith(SMOKE_GLOB.rstrip("*"))}
    problems = []
    if not keys:
        problems.append(f"no mutants matched {SMOKE_GLOB}")
    if not any(s == "killed" for s in keys.values()):
        problems.append(f"no mutant of {SMOKE_GLOB} was killed")
    problems += [f"{n} is {s}" for n, s in sorted(keys.items()) if s in BAD_STATUSES]
    if statuses.get(cas) != "killed":
        problems.append(f"the CAS inversion {cas} was not killed: {statuses.get(cas)}")
    killed = sum(s == "killed" for s in keys.values())
    print(f"mutation smoke: {killed}/{len(keys)} keys mutants killed; {cas}: {statuses.get(cas)}")
    if problems:
        sys.exit("mutation smoke failed:\n  " + "\n  ".join(problems))


def carry_moved(cache: mutation_cache.Cache) -> mutation_cache.Cache:
    """The kept verdicts after code moved: those of functions moved unchanged follow them
    (their survivor notes too), those of code that is gone are dropped; saved at once."""
    source = ROOT / "include"
    moves = mutation_cache.carry_moved(cache, source, mutation_cache.mutated_modules(source))
    if moves.renamed or moves.dropped:
        moves.cache.save()
        notes = mutation_report.NOTES
        if notes.exists():
            notes.write_text(mutation_cache.rename_notes(notes.read_text(), moves.renamed))
        print(
            f"mutation: verdicts of {len(moves.renamed)} functions moved unchanged carried over, "
            f"{len(moves.dropped)} of functions that are gone dropped",
            flush=True,
        )
    return moves.cache


def unchecked_names(cache: mutation_cache.Cache, globs: list[str]) -> list[str]:
    """The kept mutants with no verdict (or one of a function changed since), by exact name.

    Names come from the kept file, so a function that gained mutants since its last run
    has its new ones left out; they stay "not checked" in the report until a run names them.
    """
    current = mutation_cache.without_stale(cache, ROOT / "include").statuses()
    return [
        name
        for module in current.values()
        for name, code in module.items()
        if code is None and (not globs or any(fnmatch(name, g) for g in globs))
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the short CI run")
    parser.add_argument("--fresh", action="store_true", help="forget earlier results")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument(
        "--retest-survivors",
        action="store_true",
        help="rerun only the mutants whose last verdict was not a kill (after adding tests)",
    )
    parser.add_argument(
        "--unchecked",
        action="store_true",
        help="test only the mutants without a kept verdict (a glob names every mutant it "
        "matches, and mutmut re-tests every mutant it is named)",
    )
    parser.add_argument("mutants", nargs="*", help="mutant names or globs (default: all)")
    args = parser.parse_args(argv)
    if args.max_children < 1:
        parser.error("--max-children must be at least 1")
    if args.smoke:
        smoke(stage_dir("smoke", fresh=True, tests=SMOKE_TESTS), args.max_children)
        return
    stage = stage_dir("full", fresh=args.fresh)
    cache = mutation_cache.Cache({}, {}) if args.fresh else carry_moved(mutation_cache.Cache.load())
    seeded = mutation_cache.seed(stage, cache)
    if seeded:
        print(f"mutation: {seeded} modules' verdicts from {CACHE_NAME}", flush=True)
    names, globs = args.mutants, args.mutants
    if args.retest_survivors or args.unchecked:
        # a glob would rerun every mutant it names: pass the wanted ones by exact name
        names = []
        if args.retest_survivors:
            names += [
                name
                for module in load_results(stage).values()
                for name, status in module.items()
                if status in RETEST and (not globs or any(fnmatch(name, g) for g in globs))
            ]
        if args.unchecked:
            names += unchecked_names(cache, globs)
        if not names:
            print("mutation: no survivor and no mutant without a verdict among those selected")
            return
        print(f"mutation: {len(names)} mutants to test", flush=True)
    before = mutation_cache.read_stage(stage)
    try:
        run_mutmut(stage, args.max_children, names)
    finally:  # a failed or interrupted run still leaves the verdicts it reached
        target = (
            f"make mutate-survivors{' UNCHECKED=1' if args.unchecked else ''}"
            if args.retest_survivors
            else "make mutate-unchecked"
            if args.unchecked
            else "make mutate"
        )
        command = target + (
            f' MUTANTS="{" ".join(args.mutants)}"'
            if 0 < len(args.mutants) <= NAMES_SHOWN
            else f" with {len(args.mutants)} mutants named exactly"
            if args.mutants
            else ""
        )
        after = mutation_cache.read_stage(stage)
        mutation_cache.record(cache, before, after, names, command).save()
        print(f"mutation: verdicts recorded in {CACHE_NAME}", flush=True)
    check_imports_mutated_copy(stage)
    print_table(load_results(stage))


if __name__ == "__main__":
    main()

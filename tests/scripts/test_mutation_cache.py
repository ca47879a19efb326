"""scripts/mutation_cache.py: verdicts survive the trip through the repository unchanged,
and each function keeps the run that last tested it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import mutation_cache
from mutation_cache import Cache

MODULE = "offloader/gc/sweep.py"


def _write_meta(stage: Path, module: str, codes: dict[str, int | None], hashes: dict) -> None:
    meta = stage / "mutants" / "src" / (module + ".meta")
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(
        json.dumps(
            {
                "exit_code_by_key": codes,
                "hash_by_function_name": hashes,
                "type_check_error_by_key": {},
                "durations_by_key": {k: 0.1 for k in codes},
                "estimated_durations_by_key": {},
            }
        )
    )


@pytest.fixture
def stage(tmp_path: Path) -> Path:
    codes = {
        "offloader.gc.sweep.x_sweep__mutmut_1": 1,
        "offloader.gc.sweep.x_sweep__mutmut_2": 0,
        "offloader.gc.sweep.x_sweep__mutmut_3": None,
        "offloader.gc.sweep.xǁSweepResultǁsummary__mutmut_1": 36,
        "offloader.gc.sweep.xǁSweepResultǁsummary__mutmut_2": 2,  # interrupted
    }
    hashes = {"x_sweep": "aaa", "xǁSweepResultǁsummary": "bbb", "x_untested": "ccc"}
    _write_meta(tmp_path / "before", MODULE, codes, hashes)
    return tmp_path / "before"


def test_read_stage_groups_verdicts_by_function_in_mutant_order(stage: Path) -> None:
    modules = mutation_cache.read_stage(stage)
    assert modules == {
        MODULE: {
            "x_sweep": {"hash": "aaa", "codes": [1, 0, None], "run": None},
            "xǁSweepResultǁsummary": {"hash": "bbb", "codes": [36, None], "run": None},
        }
    }


def test_seed_writes_back_what_mutmut_wrote(stage: Path, tmp_path: Path) -> None:
    after = mutation_cache.read_stage(stage)
    cache = mutation_cache.record(Cache({}, {}), {}, after, [], "make mutate")
    path = tmp_path / "results.json"
    cache.save(path)
    loaded = Cache.load(path)
    assert loaded.modules == cache.modules and loaded.runs == cache.runs

    fresh = tmp_path / "fresh"
    assert mutation_cache.seed(fresh, loaded) == 1
    meta = json.loads((fresh / "mutants" / "src" / (MODULE + ".meta")).read_text())
    original = json.loads((stage / "mutants" / "src" / (MODULE + ".meta")).read_text())
    # the interrupted check comes back as not checked, to be tested again
    assert meta["exit_code_by_key"] == {
        k: None if v == 2 else v for k, v in original["exit_code_by_key"].items()
    }
    assert meta["hash_by_function_name"] == {"x_sweep": "aaa", "xǁSweepResultǁsummary": "bbb"}
    # a staging directory with results of its own keeps them
    assert mutation_cache.seed(fresh, loaded) == 0


def test_a_function_keeps_its_run_until_a_run_tests_it_again(stage: Path) -> None:
    first = mutation_cache.read_stage(stage)
    cache = mutation_cache.record(Cache({}, {}), {}, first, [], "make mutate")
    (run,) = cache.runs
    assert cache.modules[MODULE]["x_sweep"]["run"] == run

    # a later run that only tested summary (named by a glob) and the pending x_sweep mutant
    second = json.loads(json.dumps(first))
    second[MODULE]["x_sweep"]["codes"][2] = 1
    cache.runs = {"2000-01-01T00:00:00Z old": {"commit": "old"}} | cache.runs
    cache.modules[MODULE]["xǁSweepResultǁsummary"]["run"] = "2000-01-01T00:00:00Z old"
    unchanged = json.loads(json.dumps(second))
    later = mutation_cache.record(cache, first, second, [], "make mutate")
    new_run = (set(later.runs) - set(cache.runs)).pop()
    assert later.modules[MODULE]["x_sweep"]["run"] == new_run  # a verdict changed
    assert later.modules[MODULE]["xǁSweepResultǁsummary"]["run"] == "2000-01-01T00:00:00Z old"

    named = mutation_cache.record(
        later, second, unchanged, ["offloader.gc.sweep.xǁSweepResultǁsummary__mutmut_*"], "x"
    )
    newest = (set(named.runs) - set(later.runs)).pop()
    assert named.modules[MODULE]["xǁSweepResultǁsummary"]["run"] == newest
    assert named.modules[MODULE]["x_sweep"]["run"] == new_run


def test_a_changed_function_is_attributed_to_the_run_that_retested_it(stage: Path) -> None:
    first = mutation_cache.read_stage(stage)
    cache = mutation_cache.record(Cache({}, {}), {}, first, [], "make mutate")
    cache.runs = {"2000-01-01T00:00:00Z old": {"commit": "old"}}
    for entry in cache.modules[MODULE].values():
        entry["run"] = "2000-01-01T00:00:00Z old"
    changed = json.loads(json.dumps(first))
    changed[MODULE]["x_sweep"]["hash"] = "new"
    later = mutation_cache.record(cache, first, changed, [], "make mutate")
    assert later.modules[MODULE]["x_sweep"]["run"] != "2000-01-01T00:00:00Z old"
    assert later.modules[MODULE]["xǁSweepResultǁsummary"]["run"] == "2000-01-01T00:00:00Z old"


def test_save_drops_runs_no_function_refers_to(stage: Path, tmp_path: Path) -> None:
    cache = mutation_cache.record(
        Cache({"gone": {"commit": "x"}}, {}), {}, mutation_cache.read_stage(stage), [], "m"
    )
    path = tmp_path / "results.json"
    cache.save(path)
    assert "gone" not in Cache.load(path).runs


def test_verdicts_of_a_changed_function_are_not_shown_as_current(tmp_path: Path) -> None:
    from mutmut.mutation.file_mutation import compute_function_hashes

    source = tmp_path / "offloader" / "gc" / "sweep.py"
    source.parent.mkdir(parents=True)
    source.write_text("def same():\n    return 1\n\n\ndef changed():\n    return 2\n")
    hashes = compute_function_hashes(source.read_text())
    cache = Cache(
        {"r": {}},
        {
            MODULE: {
                "x_same": {"hash": hashes["x_same"], "codes": [1, 0], "run": "r"},
                "x_changed": {"hash": "old", "codes": [1], "run": "r"},
                "x_gone": {"hash": "old", "codes": [0], "run": "r"},
            }
        },
    )
    current = mutation_cache.without_stale(cache, tmp_path).modules[MODULE]
    assert current["x_same"]["codes"] == [1, 0]
    assert current["x_changed"]["codes"] == [None]
    assert current["x_gone"]["codes"] == [None]
    assert cache.modules[MODULE]["x_changed"]["codes"] == [1]  # the kept file is untouched


def test_unchecked_names_are_the_mutants_without_a_current_verdict() -> None:
    """A verdict counts only while its function's source is unchanged; globs narrow."""
    import mutation_run
    from mutmut.mutation.file_mutation import compute_function_hashes

    module = "offloader/keys.py"
    hashes = compute_function_hashes((mutation_run.ROOT / "include" / module).read_text())
    current, other = sorted(hashes)[:2]
    cache = Cache(
        {},
        {
            module: {
                current: {"hash": hashes[current], "codes": [1, None], "run": "r"},
                other: {"hash": "changed since", "codes": [1, 0], "run": "r"},
            }
        },
    )
    prefix = "offloader.keys."
    assert mutation_run.unchecked_names(cache, []) == [
        f"{prefix}{current}__mutmut_2",
        f"{prefix}{other}__mutmut_1",
        f"{prefix}{other}__mutmut_2",
    ]
    assert mutation_run.unchecked_names(cache, [f"{prefix}{other}__*"]) == [
        f"{prefix}{other}__mutmut_1",
        f"{prefix}{other}__mutmut_2",
    ]


def _sources(root: Path, files: dict[str, str]) -> Path:
    for module, text in files.items():
        (root / module).parent.mkdir(parents=True, exist_ok=True)
        (root / module).write_text(text)
    return root


def test_verdicts_follow_a_function_moved_unchanged_and_code_that_is_gone_drops(
    tmp_path: Path,
) -> None:
    """A function moved to another module (or class) unchanged keeps its verdicts under its
    new name; one changed on the way, and one whose hash two old places share with
    different verdicts, are tested again; verdicts of code that is gone are dropped."""
    from mutmut.mutation.file_mutation import compute_function_hashes

    old = {
        "offloader/a.py": "def moved():\n    return 1\n\n\ndef changed():\n    return 2\n\n\n"
        "def twin():\n    return 3\n",
        "offloader/c.py": "def twin():\n    return 3\n",
    }
    new = {
        "offloader/b.py": "class Store:\n    def moved():\n        return 1\n\n\n"
        "def changed():\n    return 20\n\n\ndef twin():\n    return 3\n",
        "offloader/c.py": "def other():\n    return 4\n",
    }
    hashes = {m: compute_function_hashes(t) for m, t in old.items()}
    a, c = hashes["offloader/a.py"], hashes["offloader/c.py"]
    cache = Cache(
        {"r": {}},
        {
            "offloader/a.py": {
                "x_moved": {"hash": a["x_moved"], "codes": [1, 0], "run": "r"},
                "x_changed": {"hash": a["x_changed"], "codes": [1], "run": "r"},
                "x_twin": {"hash": a["x_twin"], "codes": [1], "run": "r"},
            },
            "offloader/c.py": {"x_twin": {"hash": c["x_twin"], "codes": [0], "run": "r"}},
        },
    )
    source = _sources(tmp_path, new)
    moves = mutation_cache.carry_moved(cache, source, ["offloader/b.py", "offloader/c.py"])
    assert moves.cache.modules == {
        "offloader/b.py": {"xǁStoreǁmoved": {"hash": a["x_moved"], "codes": [1, 0], "run": "r"}}
    }
    assert moves.renamed == {"offloader.a.x_moved__mutmut_": "offloader.b.xǁStoreǁmoved__mutmut_"}
    assert moves.dropped == [
        "offloader.a.x_changed",
        "offloader.a.x_moved",
        "offloader.a.x_twin",
        "offloader.c.x_twin",
    ]


def test_survivor_notes_follow_their_function() -> None:
    text = (
        "# why\n\n"
        '["offloader.a.x_moved__mutmut_3"]\nkind = "equivalent"\nreason = "r"\n\n'
        '["offloader.a.x_stays__mutmut_1"]\nkind = "equivalent"\nreason = "x_moved__mutmut_3"\n'
    )
    renamed = {"offloader.a.x_moved__mutmut_": "offloader.b.xǁStoreǁmoved__mutmut_"}
    assert mutation_cache.rename_notes(text, renamed) == text.replace(
        '["offloader.a.x_moved__mutmut_3"]', '["offloader.b.xǁStoreǁmoved__mutmut_3"]'
    )


def test_mutated_modules_are_the_configured_files(tmp_path: Path) -> None:
    source = _sources(tmp_path / "src", {"offloader/gc/sweep.py": "", "offloader/keys.py": "",
                                         "offloader/cli.py": ""})  # fmt: skip
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[tool.mutmut]\nonly_mutate = ["src/offloader/gc/*", "src/offloader/keys.py"]\n'
    )
    assert mutation_cache.mutated_modules(source, pyproject) == [
        "offloader/gc/sweep.py",
        "offloader/keys.py",
    ]

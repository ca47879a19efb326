"""The chaos soak: every state machine of the product at once, under faults and kills.

One run starts SeaweedFS (loopback ports) behind the fault-injecting proxy (soak/proxy.py)
and a fresh PostgreSQL database, then runs cycles. A cycle runs each step as an
`offloader` child process through the proxy, faults on: produce into three topics (two
ledger-offloaded, one streamed), ledger offload, a streaming pass, cuts and trims (at a
cut, and at positions inside a ledger), retention, compaction, scrub, sweep, GC and scan.
Random steps are SIGKILLed (the process group) after a random delay, and during random
steps the database drops every connection of the soak's database. A step that fails is
noted with its cause (an injected fault, a kill, a dropped connection, or none of these:
unexplained); the next cycle redoes the work, as every step is idempotent.

After every cycle, with faults off and nothing running, it settles (GC passes until the
deletion queue has nothing due) and checks: `offloader verify --deep --json`, and the
writer's truth: every journaled entry (soak/journal.py) at or above its topic's start
reads back with the digest the writer wrote, and every one below the start is refused.

``python scripts/soak.py --minutes 60 --seed S`` (or ``make soak``); ``--cycles N`` for a
fixed number of cycles (the CI form, tests/soak/test_soak.py). The seed is printed first
so a run can be replayed (the decisions replay; the timings of a shared machine do not).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
from psycopg2.extensions import make_dsn
from sqlalchemy.engine import make_url

import offloader
from fixtures.cli import CLI, child_env
from fixtures.databases import pg_dsn, temporary_database
from fixtures.seaweedfs_server import SeaweedS3, find_weed
from offloader.exceptions import TrimmedError
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime, upgrade_database
from offloader.settings import Settings
from soak.journal import Journal
from soak.proxy import INTERNAL, RESET_BEFORE, RESET_MID, SLOWDOWN, STALL, FaultPlan, FaultProxy
from soak.proxy import FaultRule as Rule

KiB = 1024
MiB = 1024 * KiB

#: verify's breach kinds, by what they mean for the summary
LEAK_KINDS = frozenset({"orphan"})
LOSS_KINDS = frozenset({"missing_object", "size_mismatch", "unreadable", "corrupt"})
DOUBLE_KINDS = frozenset({"double_commit"})

#: the short settings that make cycles quick: a stall costs a 2 s read timeout, not 15 s, a
#: killed streaming pass holds its topic for 6 s
READ_TIMEOUT = 2.0
SHORT_SETTINGS: dict[str, Any] = {
    "attempt_lease_seconds": 3.0,
    "stream_lease_seconds": 6.0,
    "s3_read_timeout_seconds": READ_TIMEOUT,
    "s3_connect_timeout_seconds": 2.0,
    "s3_operation_deadline_seconds": 20.0,
    "replaced_object_grace_seconds": 0.0,
    "delete_retry_base_seconds": 0.0,
    "delete_retry_max_seconds": 1.0,
    "sweep_grace_seconds": 5.0,
    "multipart_max_age_seconds": 60.0,
}
#: a pass that finds a killed pass's stream lease live (``stream_lease_seconds``) does
#: nothing and exits 2 (the DAG reports it `busy`): expected after a kill, not a failure
STREAM_BUSY = "holds the stream until"

LEDGER_A = "soak-ledger-a"  # ledger offload, size retention
LEDGER_B = "soak-ledger-b"  # ledger offload, trims at cuts and positions
STREAM_C = "soak-stream-c"  # streaming offload, trims at positions
TOPICS: dict[str, list[str]] = {
    LEDGER_A: [
        "ledger_max_entries=12",
        "offload_threshold_bytes=0",
        "deletion_lag_seconds=0",
        "retention_size_bytes=600000",
    ],
    LEDGER_B: ["ledger_max_entries=25", "offload_threshold_bytes=0", "deletion_lag_seconds=1"],
    STREAM_C: [
        "streaming=true",
        f"min_part_bytes={5 * MiB}",
        f"segment_max_bytes={8 * MiB}",
        "segment_max_age_seconds=20",
        "ledger_max_entries=16",
        "deletion_lag_seconds=0",
    ],
}


@dataclass
class SoakOptions:
    seed: int
    minutes: float | None = None
    cycles: int | None = None
    kill_rate: float = 0.25  # of the steps under chaos, the share SIGKILLed
    drop_rate: float = 0.25  # of the steps under chaos, the share whose DB connections drop
    step_timeout: float = 120.0  # a step still running then is killed and noted `deadline`
    out_dir: Path = Path("var/soak")
    keep_workdir: bool = False
    require_verify: bool = True
    log: Any = sys.stdout


@dataclass
class StepResult:
    step: str
    rc: int
    causes: list[str]
    seconds: float
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def json(self) -> Any:
        try:
            return json.loads(self.stdout)
        except ValueError:
            return None


@dataclass
class Tally:
    """Everything the summary counts."""

    cycles: int = 0
    operations: Counter[str] = field(default_factory=Counter)
    failed_steps: Counter[str] = field(default_factory=Counter)
    failed_by_cause: Counter[str] = field(default_factory=Counter)
    unexplained: list[dict[str, Any]] = field(default_factory=list)
    kills: int = 0
    deadline_kills: int = 0
    drop_events: int = 0
    dropped_connections: int = 0
    entries_verified: int = 0
    entries_refused_below_start: int = 0
    lost_entries: list[dict[str, Any]] = field(default_factory=list)
    readable_below_start: list[dict[str, Any]] = field(default_factory=list)
    verify_runs: int = 0
    verify_failed: int = 0
    verify_unavailable: int = 0
    breaches: Counter[str] = field(default_factory=Counter)
    breach_samples: list[dict[str, Any]] = field(default_factory=list)
    settle_problems: list[str] = field(default_factory=list)


class Soak:
    def __init__(self, options: SoakOptions) -> None:
        self.options = options
        self.rng = random.Random(options.seed)
        self.tally = Tally()
        self.journal = Journal()
        self.notes: list[str] = []
        self.steps_log: list[dict[str, Any]] = []
        self.durations: dict[str, float] = {}  # a step's mean run time so far
        self._stack = contextlib.ExitStack()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"offloader-soak-{options.seed}-"))
        self.plan = FaultPlan(seed=options.seed)
        self.settings: Settings
        self.db_name = ""
        self.env: dict[str, str] = {}
        self.produced_seeds = random.Random(options.seed ^ 0x5EED)

    # --- set-up --------------------------------------------------------------------------
    def _say(self, text: str) -> None:
        print(text, file=self.options.log, flush=True)

    def setup(self) -> None:
        server = SeaweedS3.start(self.workdir / "seaweedfs", weed=find_weed())
        self._stack.callback(server.stop)
        proxy = FaultProxy(server.endpoint_url, self.plan).start()
        self._stack.callback(proxy.stop)
        direct = server.make_settings("soak")
        url = self._stack.enter_context(temporary_database("offloader_soak"))
        self.db_name = str(make_url(url).database)
        values: dict[str, Any] = {
            "data_dir": self.workdir / "data",
            "ledger_dir": self.workdir / "ledgers",
            "metadata_url": url,
            "object_store_url": direct.object_store_url,
            "s3_endpoint_url": proxy.endpoint_url,  # every request through the proxy
            "s3_region": server.region,
            "s3_access_key_id": server.access_key,
            "s3_secret_access_key": server.secret_key,
            **SHORT_SETTINGS,
        }
        self.settings = upgrade_settings(Settings.from_values(**values))
        # the children run the library this driver imported (a checkout's include/, not
        # whatever the virtualenv installed)
        library = str(Path(offloader.__file__).resolve().parent.parent)
        path = os.pathsep.join(filter(None, [library, os.environ.get("PYTHONPATH")]))
        self.env = child_env(self.settings, env={"PYTHONPATH": path})
        self.notes.append(f"the steps ran the library at {library}")
        self.plan.replace_rules(self._rules(READ_TIMEOUT))
        self.plan.stall_seconds = READ_TIMEOUT + 1.5
        for topic, policy in TOPICS.items():
            args = ["topic", "create", topic]
            for item in policy:
                args += ["--set", item]
            self._must(args)

    def _rules(self, read_timeout: float) -> list[Rule]:
        """Per verb and key pattern, each kind at a seeded rate around its base rate."""

        def rate(base: float) -> float:
            return round(base * self.rng.uniform(0.5, 1.5), 4)

        rules = []
        kinds = [SLOWDOWN, INTERNAL, RESET_BEFORE, RESET_MID, STALL]
        base = {SLOWDOWN: 0.05, INTERNAL: 0.03, RESET_BEFORE: 0.03, RESET_MID: 0.03, STALL: 0.01}
        patterns = {
            "PUT": r"\?.*partNumber=|/[^?]+$",  # UploadPart and PutObject
            "POST": r"\?(uploads|uploadId=|delete)",  # create/complete multipart, DeleteObjects
            "GET": r"/[^?]+",  # object GETs (ranged blocks and indexes) and listings
            "DELETE": r".",
            "HEAD": r".",
        }
        for verb, pattern in patterns.items():
            for kind in kinds:
                rules.append(Rule(verb, pattern, kind, rate(base[kind])))
        return rules

    def _must(self, args: list[str]) -> StepResult:
        result = self.step("setup", args, chaos=False)
        if not result.ok:
            raise RuntimeError(f"offloader {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    # --- one step ------------------------------------------------------------------------
    def step(self, name: str, args: list[str], *, chaos: bool = True) -> StepResult:
        """Run ``offloader ARGS --json`` as a child; under chaos, faults on, maybe a kill
        after a random delay, maybe the database's connections dropped meanwhile."""
        self.tally.operations[name] += 1
        kill_at = drop_at = None
        # a random moment of the step's usual run (its mean so far: on a loaded machine
        # a CLI takes seconds just to import, and a kill then would test nothing)
        usual = self.durations.get(name, 5.0)
        if chaos and self.rng.random() < self.options.kill_rate:
            kill_at = self.rng.uniform(0.1, 1.1) * usual
        if chaos and self.rng.random() < self.options.drop_rate:
            drop_at = self.rng.uniform(0.1, 0.9) * usual
        faults_before = self.plan.snapshot()
        self.plan.set_enabled(chaos)
        started = time.monotonic()
        process = subprocess.Popen(
            [*CLI, *args, "--json"],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: the kill takes its children too
        )
        causes: list[str] = []
        timers = []
        if kill_at is not None:
            timers.append(threading.Timer(kill_at, self._kill, (process, causes, "kill")))
        if drop_at is not None:
            timers.append(threading.Timer(drop_at, self._drop, (process, causes)))
        for timer in timers:
            timer.start()
        try:
            stdout, stderr = process.communicate(timeout=self.options.step_timeout)
        except subprocess.TimeoutExpired:
            self._kill(process, causes, "deadline")
            stdout, stderr = process.communicate()
        finally:
            for timer in timers:
                timer.cancel()
                timer.join()
            self.plan.set_enabled(False)
        after = self.plan.snapshot()
        if any(after[k] > faults_before[k] for k in after):
            causes.append("fault")
        if process.returncode and STREAM_BUSY in stderr:
            causes.append("stream_busy")
        elapsed = time.monotonic() - started
        if process.returncode == 0:
            self.durations[name] = 0.7 * self.durations.get(name, elapsed) + 0.3 * elapsed
        result = StepResult(
            name, process.returncode, causes, time.monotonic() - started, stdout, stderr
        )
        if not result.ok and not _verify_missing(result):
            self._note_failure(result)
        self.steps_log.append(
            {
                "cycle": self.tally.cycles + 1,
                "step": name,
                "args": args,
                "rc": result.rc,
                "causes": causes,
                "kill_at": None if kill_at is None else round(kill_at, 2),
                "drop_at": None if drop_at is None else round(drop_at, 2),
                "seconds": round(result.seconds, 2),
                "stderr": result.stderr.strip()[-300:] if result.rc else "",
            }
        )
        return result

    def _kill(self, process: subprocess.Popen[str], causes: list[str], why: str) -> None:
        if process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
            causes.append(why)
            if why == "kill":
                self.tally.kills += 1
            else:
                self.tally.deadline_kills += 1

    def _drop(self, process: subprocess.Popen[str], causes: list[str]) -> None:
        """Drop the database's connections; while the step holds none yet (it is still
        starting), try again every half second until it does or ends."""
        self.tally.drop_events += 1
        while process.poll() is None:
            dropped = drop_connections(self.db_name)
            if dropped:
                self.tally.dropped_connections += dropped
                causes.append("db_drop")
                return
            time.sleep(0.5)

    def _note_failure(self, result: StepResult) -> None:
        self.tally.failed_steps[result.step] += 1
        cause = "+".join(sorted(set(result.causes))) or "unexplained"
        self.tally.failed_by_cause[cause] += 1
        if cause == "unexplained":
            self.tally.unexplained.append(
                {
                    "cycle": self.tally.cycles + 1,
                    "step": result.step,
                    "rc": result.rc,
                    "stderr": result.stderr.strip()[-600:],
                }
            )

    # --- one cycle -----------------------------------------------------------------------
    def cycle(self) -> None:
        number = self.tally.cycles + 1
        self._produce(LEDGER_A, count=self.rng.randint(20, 60), size=4 * KiB)
        self._produce(LEDGER_B, count=self.rng.randint(20, 60), size=self.rng.randint(500, 9000))
        self._produce(STREAM_C, count=36, size=160 * KiB)  # 5.6 MiB: above one part
        for topic in (LEDGER_A, LEDGER_B):
            self.step("offload", ["offload", topic])
        self.step(
            "stream", ["stream", STREAM_C, *(["--close-now"] if self.rng.random() < 0.6 else [])]
        )
        self._trims()
        self.step("retention", ["retention", LEDGER_A])
        self.step(
            "rewrite",
            [
                "rewrite",
                "--mode",
                "compact",
                "--target-bytes",
                str(2 * MiB),
                "--small-bytes",
                str(512 * KiB),
                "--max-groups",
                "4",
            ],
        )
        self.step("scrub", ["scrub"])
        self.step("sweep", ["sweep"])
        self.step("gc", ["gc"])
        self.step("scan", ["scan"])
        self.settle_and_check(number)
        self.tally.cycles = number

    def _produce(self, topic: str, *, count: int, size: int) -> None:
        seed = self.produced_seeds.randrange(2**31)
        with self._runtime() as rt:
            produce = self.journal.begin(rt, topic, seed, count, size)
        result = self.step(
            "produce",
            ["produce", topic, "--count", str(count), "--size", str(size), "--seed", str(seed)],
        )
        produce.completed = result.ok
        with self._runtime() as rt:
            self.journal.take(rt, topic)
        self.journal.check_complete(topic, produce)

    def _trims(self) -> None:
        for topic in (LEDGER_B, STREAM_C):
            choice = self.rng.random()
            if choice < 0.35:
                cut = self.step("cut", ["cut", "create", topic]).json()
                if isinstance(cut, dict) and "cut_id" in cut and self.rng.random() < 0.5:
                    self.step("trim", ["trim", topic, "--cut", str(cut["cut_id"])])
            elif choice < 0.8:
                position = self._position_to_trim(topic)
                if position is not None:
                    self.step("trim", ["trim", topic, "--position", position])

    def _position_to_trim(self, topic: str) -> str | None:
        """A position inside a journaled ledger in the lower third of what is readable."""
        with self._runtime() as rt:
            start = rt.metadata.get_topic(topic).start
        live = sorted(
            key
            for key in self.journal.entries.get(topic, {})
            if key >= (start.ledger_id, start.entry_id)
        )
        if len(live) < 10:
            return None
        ledger_id, entry_id = live[self.rng.randrange(len(live) // 3)]
        return f"{ledger_id}:{entry_id}"

    # --- after a cycle: settle, verify, read back -------------------------------------------
    def settle_and_check(self, number: int) -> None:
        self.plan.set_enabled(False)
        for _ in range(6):  # each pass finishes what is due; a dropped try is due at once
            gc = self.step("settle-gc", ["gc"], chaos=False)
            if not gc.ok:
                self.tally.settle_problems.append(
                    f"cycle {number}: gc failed: {gc.stderr.strip()[-300:]}"
                )
                break
            with self._runtime() as rt:
                backlog = rt.metadata.deletions.backlog(self.settings.gc_failing_tries)
            if not backlog.due:
                break
        else:
            self.tally.settle_problems.append(f"cycle {number}: deletions still due after 6 GCs")
        self._verify(number)
        self._read_back(number)
        faults = self.plan.snapshot()
        self._say(
            f"cycle {number}: ops={sum(self.tally.operations.values())} "
            f"failed={sum(self.tally.failed_steps.values())} kills={self.tally.kills} "
            f"drops={self.tally.drop_events} faults={sum(faults.values())} "
            f"verified={self.tally.entries_verified} breaches={sum(self.tally.breaches.values())} "
            f"lost={len(self.tally.lost_entries)}"
        )

    def _verify(self, number: int) -> None:
        result = self.step("verify", ["verify", "--deep"], chaos=False)
        self.tally.verify_runs += 1
        report = result.json()
        if not isinstance(report, dict) or "ok" not in report:
            if _verify_missing(result):
                self.tally.verify_unavailable += 1
                return
            self.tally.verify_failed += 1
            self.tally.settle_problems.append(
                f"cycle {number}: verify rc={result.rc} without a report: "
                f"{result.stderr.strip()[-300:]}"
            )
            return
        if not report["ok"] or result.rc != 0:
            self.tally.verify_failed += 1
        for breach in report.get("breaches", []):
            self.tally.breaches[str(breach.get("kind"))] += 1
            if len(self.tally.breach_samples) < 20:
                self.tally.breach_samples.append({"cycle": number, **breach})

    def _read_back(self, number: int) -> None:
        """Every journaled entry at or above its topic's start reads back as written;
        below the start, reads are refused."""
        with self._runtime() as rt:
            reader = TopicReader(rt)
            for topic, digests in self.journal.entries.items():
                start = rt.metadata.get_topic(topic).start
                first = (start.ledger_id, start.entry_id)
                by_ledger: dict[int, list[int]] = {}
                for ledger_id, entry_id in digests:
                    by_ledger.setdefault(ledger_id, []).append(entry_id)
                for ledger_id, entries in sorted(by_ledger.items()):
                    above = sorted(e for e in entries if (ledger_id, e) >= first)
                    below = sorted(e for e in entries if (ledger_id, e) < first)
                    if above:
                        self._check_entries(reader, topic, ledger_id, above, digests, number)
                    if below:
                        self._check_refused(reader, topic, ledger_id, below[-1], number)

    def _check_entries(
        self,
        reader: TopicReader,
        topic: str,
        ledger_id: int,
        entries: list[int],
        digests: dict[tuple[int, int], str],
        number: int,
    ) -> None:
        import hashlib

        try:
            got = {
                entry_id: hashlib.sha256(payload).hexdigest()
                for entry_id, payload in reader.read(
                    topic, ledger_id, entries[0], entries[-1], Source.AUTO
                )
            }
        except Exception as exc:
            got = {}
            error = f"{type(exc).__name__}: {exc}"
        else:
            error = ""
        for entry_id in entries:
            if got.get(entry_id) == digests[(ledger_id, entry_id)]:
                self.tally.entries_verified += 1
                continue
            self.tally.lost_entries.append(
                {
                    "cycle": number,
                    "topic": topic,
                    "ledger": ledger_id,
                    "entry": entry_id,
                    "why": error or ("different payload" if entry_id in got else "not returned"),
                }
            )

    def _check_refused(
        self, reader: TopicReader, topic: str, ledger_id: int, entry_id: int, number: int
    ) -> None:
        try:
            reader.read_entry(topic, ledger_id, entry_id)
        except TrimmedError:
            self.tally.entries_refused_below_start += 1
            return
        except Exception as exc:
            what = f"{type(exc).__name__}: {exc}"
        else:
            what = "returned a payload"
        self.tally.readable_below_start.append(
            {"cycle": number, "topic": topic, "ledger": ledger_id, "entry": entry_id, "why": what}
        )

    def _runtime(self) -> Runtime:
        """A fresh runtime per use: a dropped connection must not outlive its step."""
        return Runtime.open(self.settings)

    # --- the whole run ---------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        started = dt.datetime.now(dt.UTC)
        self._say(f"soak: seed {self.options.seed} (replay with SOAK_SEED={self.options.seed})")
        deadline = time.monotonic() + 60 * self.options.minutes if self.options.minutes else None
        try:
            self.setup()
            while True:
                if self.options.cycles is not None and self.tally.cycles >= self.options.cycles:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                self.cycle()
        finally:
            self._stack.close()
            if not self.options.keep_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
        return self.summary(started, dt.datetime.now(dt.UTC))

    def summary(self, started: dt.datetime, finished: dt.datetime) -> dict[str, Any]:
        t = self.tally
        leaked = sum(n for k, n in t.breaches.items() if k in LEAK_KINDS)
        lost_objects = sum(n for k, n in t.breaches.items() if k in LOSS_KINDS)
        doubles = sum(n for k, n in t.breaches.items() if k in DOUBLE_KINDS)
        lost = len(t.lost_entries) + lost_objects + len(self.journal.mismatches)
        verify_failed = t.verify_failed + (
            t.verify_unavailable if self.options.require_verify else 0
        )
        failures = []
        if leaked:
            failures.append(f"{leaked} objects leaked")
        if lost:
            failures.append(f"{lost} lost")
        if doubles:
            failures.append(f"{doubles} double commits")
        if verify_failed:
            failures.append(f"verify failed or missing {verify_failed} times")
        if t.readable_below_start:
            failures.append(f"{len(t.readable_below_start)} reads below the start not refused")
        return {
            "seed": self.options.seed,
            "machine": machine(),
            "commit": commit_of(Path(offloader.__file__).resolve().parents[2]),
            "started": started.isoformat(timespec="seconds"),
            "finished": finished.isoformat(timespec="seconds"),
            "minutes": round((finished - started).total_seconds() / 60, 2),
            "cycles": t.cycles,
            "operations": dict(sorted(t.operations.items())),
            "failed_steps": dict(sorted(t.failed_steps.items())),
            "failed_by_cause": dict(sorted(t.failed_by_cause.items())),
            "unexplained_failures": t.unexplained,
            "faults": self.plan.snapshot(),
            "kills": t.kills,
            "deadline_kills": t.deadline_kills,
            "db_drop_events": t.drop_events,
            "dropped_connections": t.dropped_connections,
            "entries_journaled": self.journal.total_entries,
            "entries_verified": t.entries_verified,
            "entries_refused_below_start": t.entries_refused_below_start,
            "leaked": leaked,
            "lost": lost,
            "lost_entries": t.lost_entries[:50],
            "journal_mismatches": [m.__dict__ for m in self.journal.mismatches[:50]],
            "double_commits": doubles,
            "readable_below_start": t.readable_below_start[:50],
            "verify": {
                "runs": t.verify_runs,
                "failed": t.verify_failed,
                "unavailable": t.verify_unavailable,
                "breaches": dict(sorted(t.breaches.items())),
                "samples": t.breach_samples,
            },
            "settle_problems": t.settle_problems,
            "notes": self.notes,
            "ok": not failures,
            "failures": failures,
        }


def upgrade_settings(settings: Settings) -> Settings:
    upgrade_database(settings)
    return settings


def drop_connections(database: str) -> int:
    """Terminate every connection to ``database`` but this one; return how many."""
    conn = psycopg2.connect(make_dsn(pg_dsn(), dbname="postgres"), connect_timeout=3)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            )
            return sum(1 for (done,) in cur.fetchall() if done)
    finally:
        conn.close()


def _verify_missing(result: StepResult) -> bool:
    """`offloader verify` is not in this build (its branch not merged yet)."""
    return result.step == "verify" and result.rc == 2 and "invalid choice" in result.stderr


# --- reporting -------------------------------------------------------------------------------
def machine() -> str:
    """What the run ran on: CPUs, memory, system and Python."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} CPUs, {memory:.0f} GiB, {platform.platform()}, "
        f"Python {platform.python_version()}"
    )


def commit_of(checkout: Path) -> str | None:
    """The checkout's commit (and whether it had changes), None outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head} (with uncommitted changes)" if dirty else head


def render_table(summary: dict[str, Any]) -> str:
    """The summary as a Markdown table (printed, written next to the JSON, put in the docs)."""
    faults = summary["faults"]
    rows = [
        ("seed", summary["seed"]),
        *[(k, summary[k]) for k in ("machine", "commit") if summary.get(k)],
        ("minutes", summary["minutes"]),
        ("cycles", summary["cycles"]),
        ("operations", _pairs(summary["operations"])),
        ("failed steps", _pairs(summary["failed_steps"]) or "0"),
        ("failed steps by cause", _pairs(summary["failed_by_cause"]) or "0"),
        ("faults injected", f"{sum(faults.values())} ({_pairs(faults)})"),
        ("kills (SIGKILL)", summary["kills"]),
        ("steps past their deadline", summary["deadline_kills"]),
        (
            "database drops (connections)",
            f"{summary['db_drop_events']} ({summary['dropped_connections']})",
        ),
        ("entries verified", summary["entries_verified"]),
        ("reads below the start refused", summary["entries_refused_below_start"]),
        ("objects leaked", summary["leaked"]),
        ("entries or objects lost", summary["lost"]),
        ("double commits", summary["double_commits"]),
        (
            "verify runs (failed, unavailable)",
            "{runs} ({failed}, {unavailable})".format(**summary["verify"]),
        ),
        ("verdict", "ok" if summary["ok"] else "FAILED: " + "; ".join(summary["failures"])),
    ]
    lines = ["| figure | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines)


def _pairs(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items() if v)


def write_results(
    summary: dict[str, Any], out_dir: Path, steps: list[dict[str, Any]] | None = None
) -> tuple[Path, Path]:
    """var/soak/<UTC date>-seed<S>.json and .md."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{summary['started'][:10]}-seed{summary['seed']}"
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    if steps:
        steps_path = out_dir / f"{stem}-steps.jsonl"
        steps_path.write_text("".join(json.dumps(s) + "\n" for s in steps))
    md = [f"# Soak, seed {summary['seed']}, {summary['started']}", "", render_table(summary), ""]
    if summary["notes"]:
        md += ["Notes:", *[f"- {n}" for n in summary["notes"]], ""]
    if summary["unexplained_failures"]:
        md += [
            "Unexplained step failures:",
            *[f"- {json.dumps(u)}" for u in summary["unexplained_failures"]],
            "",
        ]
    md_path.write_text("\n".join(md))
    return json_path, md_path


DOCS_BEGIN = "<!-- soak-results:begin (scripts/soak.py --write-docs) -->"
DOCS_END = "<!-- soak-results:end -->"


def write_docs(result_json: Path, docs: Path) -> None:
    """Put a run's figures into the marked block of ``docs`` (created at the end if absent)."""
    summary = json.loads(result_json.read_text())
    block = "\n".join(
        [
            DOCS_BEGIN,
            f"Soak run of {summary['started']} (seed {summary['seed']}; "
            f"`SOAK_SEED={summary['seed']} make soak` replays it):",
            "",
            render_table(summary),
            DOCS_END,
        ]
    )
    text = docs.read_text() if docs.exists() else "# Reliability\n"
    if DOCS_BEGIN in text and DOCS_END in text:
        head, rest = text.split(DOCS_BEGIN, 1)
        tail = rest.split(DOCS_END, 1)[1]
        text = head + block + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    docs.write_text(text)


# --- command line ------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", 60)))
    parser.add_argument(
        "--cycles", type=int, default=None, help="run this many cycles (not --minutes)"
    )
    parser.add_argument("--seed", type=int, default=None, help="default: SOAK_SEED, else random")
    parser.add_argument("--kill-rate", type=float, default=0.25)
    parser.add_argument("--drop-rate", type=float, default=0.25)
    parser.add_argument("--out", type=Path, default=Path("var/soak"))
    parser.add_argument("--keep-workdir", action="store_true")
    parser.add_argument(
        "--allow-no-verify",
        action="store_true",
        help="a missing `offloader verify` is noted, not a failure",
    )
    parser.add_argument("--write-docs", type=Path, metavar="RESULT.json")
    parser.add_argument("--docs", type=Path, default=Path("docs/RELIABILITY.md"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.write_docs is not None:
        write_docs(args.write_docs, args.docs)
        print(f"wrote the figures of {args.write_docs} into {args.docs}")
        return 0
    seed = args.seed
    if seed is None:
        seed = (
            int(os.environ["SOAK_SEED"])
            if os.environ.get("SOAK_SEED")
            else random.SystemRandom().randrange(2**31)
        )
    options = SoakOptions(
        seed=seed,
        minutes=None if args.cycles is not None else args.minutes,
        cycles=args.cycles,
        kill_rate=args.kill_rate,
        drop_rate=args.drop_rate,
        out_dir=args.out,
        keep_workdir=args.keep_workdir,
        require_verify=not args.allow_no_verify,
    )
    soak = Soak(options)
    summary = soak.run()
    json_path, md_path = write_results(summary, options.out_dir, soak.steps_log)
    print(render_table(summary))
    for note in summary["notes"]:
        print(f"note: {note}")
    print(f"results: {json_path} {md_path}")
    return 0 if summary["ok"] else 1

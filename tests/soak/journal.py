"""The writer's truth for the soak: what every produce wrote, entry by entry.

``offloader produce TOPIC --count N --size B --seed S`` writes ``random.Random(S).randbytes(B)``
N times, so what a produce should have written is known without reading anything. Right
after each produce step (before any offload, trim or hot deletion can run) the journal reads
the topic's newly sealed ledgers from the hot tier and checks them against that sequence: a
produce that exited 0 wrote all of it, a killed one a prefix (the next writer's recovery
seals the ledger it left open and cuts its torn tail, so an open ledger is journaled only
once sealed). The digests are then the truth every later read is compared with.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime


def expected_digests(seed: int, count: int, size: int) -> list[str]:
    """The SHA-256 of each entry `offloader produce --seed SEED` writes, in order."""
    rng = random.Random(seed)
    return [hashlib.sha256(rng.randbytes(size)).hexdigest() for _ in range(count)]


@dataclass
class Produce:
    """One produce step: its ledgers are those above ``after_ledger`` and at or below the
    next produce's ``after_ledger`` on the same topic."""

    seed: int
    count: int
    size: int
    after_ledger: int
    completed: bool = False  # exited 0: every entry must be there
    matched: int = 0  # entries of the sequence found so far
    journaled_ledgers: set[int] = field(default_factory=set)


@dataclass
class Mismatch:
    topic: str
    ledger_id: int
    entry_id: int
    message: str


@dataclass
class Journal:
    """Per topic: the produces in order and the digest of every journaled entry."""

    produces: dict[str, list[Produce]] = field(default_factory=dict)
    entries: dict[str, dict[tuple[int, int], str]] = field(default_factory=dict)
    mismatches: list[Mismatch] = field(default_factory=list)

    def begin(self, rt: Runtime, topic: str, seed: int, count: int, size: int) -> Produce:
        """Record a produce about to run: where its ledgers begin (the topic's newest now)."""
        newest = max((x.ledger_id for x in rt.metadata.list_ledgers(topic)), default=-1)
        produce = Produce(seed=seed, count=count, size=size, after_ledger=newest)
        self.produces.setdefault(topic, []).append(produce)
        return produce

    def take(self, rt: Runtime, topic: str) -> int:
        """Journal every sealed ledger of ``topic`` not journaled yet (read from the hot
        tier), checking it against its produce's sequence; return the entries journaled."""
        produces = self.produces.get(topic, [])
        digests = self.entries.setdefault(topic, {})
        taken = 0
        for ledger in sorted(rt.metadata.list_ledgers(topic), key=lambda x: x.ledger_id):
            owner = _owner(produces, ledger.ledger_id)
            if owner is None or ledger.ledger_id in owner.journaled_ledgers:
                continue
            if ledger.state != "sealed":
                break  # left open by a killed produce: the next produce's recovery seals it
            owner.journaled_ledgers.add(ledger.ledger_id)
            if ledger.entry_count == 0:
                continue
            expected = expected_digests(owner.seed, owner.count, owner.size)
            for entry_id, payload in TopicReader(rt).read(
                topic, ledger.ledger_id, 0, ledger.entry_count - 1, Source.HOT
            ):
                digest = hashlib.sha256(payload).hexdigest()
                digests[(ledger.ledger_id, entry_id)] = digest
                taken += 1
                if owner.matched >= len(expected) or expected[owner.matched] != digest:
                    self.mismatches.append(
                        Mismatch(
                            topic,
                            ledger.ledger_id,
                            entry_id,
                            f"entry {owner.matched} of produce seed {owner.seed} is not what "
                            "the writer wrote",
                        )
                    )
                owner.matched += 1
        return taken

    def check_complete(self, topic: str, produce: Produce) -> None:
        """A produce that exited 0 sealed all its ledgers: every entry must be there."""
        if produce.completed and produce.matched != produce.count:
            self.mismatches.append(
                Mismatch(
                    topic,
                    -1,
                    -1,
                    f"produce seed {produce.seed} exited 0 but {produce.matched} of "
                    f"{produce.count} entries were found",
                )
            )

    @property
    def total_entries(self) -> int:
        return sum(len(e) for e in self.entries.values())


def _owner(produces: list[Produce], ledger_id: int) -> Produce | None:
    owner = None
    for produce in produces:
        if ledger_id > produce.after_ledger:
            owner = produce
    return owner

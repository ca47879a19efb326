"""The ``offloader`` console script: every command with ``--json`` for machine-readable output."""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import logging
import os
import random
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, NoReturn

from offloader import cli_metrics, cli_service_levels
from offloader.diagnostics import describe_error
from offloader.format import ENTRY_FRAME, HEADER_LEN
from offloader.gc.deletion_queue import DEFAULT_PASS_LIMIT, process_deletions
from offloader.gc.run import collect_garbage
from offloader.gc.stores import list_stores, retire_store
from offloader.gc.sweep import sweep
from offloader.hottier import MAX_ENTRY_BYTES
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.log_redaction import RedactingFilter
from offloader.metadata import StreamCut
from offloader.metadata.snapshot import import_snapshot
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.offload.params import OffloadRunParams
from offloader.offload.runs import TopicOffloadResult, plan_batches
from offloader.params import parse_ledger_range
from offloader.policy import OffloadPolicy
from offloader.read.topic_reader import Source, TopicReader
from offloader.recovery import rebuild_from_objects
from offloader.results import RunResult, jsonable
from offloader.retention.cuts import take_cut
from offloader.retention.run import apply_retention
from offloader.retention.trim import delete_topic, resolve_target, trim_topic
from offloader.rewrite.params import COMPACT, TO_V1, TO_V2, RewriteParams
from offloader.rewrite.run import run_rewrite
from offloader.runtime import Runtime, check_database, export_metadata, upgrade_database
from offloader.scrub import run_scrub
from offloader.settings import Settings
from offloader.status import status_report
from offloader.stream.offloader import StreamingOffloader
from offloader.stream.runs import stream_topic
from offloader.verify import verify_promises

Handler = Callable[[argparse.Namespace, Runtime], tuple[Any, str]]
# `offloader db` runs without a runtime (the schema may be behind): it gets the settings
SettingsHandler = Callable[[argparse.Namespace, Settings], tuple[Any, str]]

# produce generates test data in memory: one payload at a time, at most this many entries.
PRODUCE_MAX_COUNT = 10_000_000
PRODUCE_MAX_GENERATED = 1024 * 1024 * 1024  # one random payload held in memory


def _parse_settings(pairs: Sequence[str]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for pair in pairs:
        field, sep, value = pair.partition("=")
        if not sep or not field:
            raise ValueError(f"--set takes FIELD=VALUE, got {pair!r}")
        changes[field.strip()] = None if value.strip().lower() in ("none", "null", "") else value
    return changes


def _listing(lines: Iterable[str], empty: str) -> str:
    return "\n".join(lines) or empty


# --- commands ------------------------------------------------------------------------------
def cmd_topic_create(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    policy = OffloadPolicy().updated(_parse_settings(args.set))
    topic = rt.metadata.create_topic(args.name, policy)
    return topic, f"created topic {topic.name}"


def cmd_topic_list(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    topics = rt.metadata.list_topics()
    return topics, "\n".join(t.name for t in topics) or "(no topics)"


def cmd_topic_policy(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    topic = rt.metadata.get_topic(args.name)
    if args.set:
        topic = rt.metadata.set_policy(topic, topic.policy.updated(_parse_settings(args.set)))
    policy = topic.policy.model_dump(mode="json")
    return policy, "\n".join(f"{k} = {v}" for k, v in policy.items())


def produce_size_limit(policy: OffloadPolicy) -> tuple[int, str]:
    """The largest entry produce may write to a topic, and the rule that sets it."""
    limits = [
        (MAX_ENTRY_BYTES, "the hot tier's record length field"),
        (
            policy.max_block_size - HEADER_LEN - ENTRY_FRAME,
            f"one block of the topic's max_block_size of {policy.max_block_size}",
        ),
        (PRODUCE_MAX_GENERATED, "what produce generates in memory"),
    ]
    return min(limits)


def cmd_produce(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    if not 0 <= args.count <= PRODUCE_MAX_COUNT:
        raise ValueError(f"--count {args.count}: must be between 0 and {PRODUCE_MAX_COUNT}")
    if args.size < 0:
        raise ValueError(f"--size {args.size}: must be >= 0")
    limit, rule = produce_size_limit(rt.metadata.get_topic(args.topic).policy)
    if args.size > limit:
        raise ValueError(f"--size {args.size}: at most {limit} bytes (an entry must fit {rule})")
    rng = random.Random(args.seed)
    with ManagedLedgerWriter(rt.metadata, rt.hot, args.topic) as writer:
        for _ in range(args.count):
            writer.append(rng.randbytes(args.size))
    ledgers = [ledger.ledger_id for ledger in writer.sealed]
    result = {
        "topic": args.topic,
        "entries": args.count,
        "bytes": args.count * args.size,
        "sealed_ledgers": ledgers,
    }
    return result, f"wrote {args.count} entries of {args.size} bytes; sealed ledgers {ledgers}"


def cmd_ledgers(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    ledgers = rt.metadata.list_ledgers(args.topic)
    return ledgers, _listing(
        (
            f"{x.ledger_id:>8} {x.state:<7} entries={x.entry_count:<8} bytes={x.size_bytes:<12} "
            f"offload={x.offload_state:<10} hot={x.hot_state:<8} retention={x.deletion_state}"
            for x in ledgers
        ),
        "(no ledgers)",
    )


def cmd_offload(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    started = time.monotonic()
    results = LedgerOffloader(rt).offload_topic(args.topic, up_to=args.up_to)
    hot_deleted = delete_hot_copies(rt.metadata, rt.hot, args.topic)
    result = TopicOffloadResult(args.topic, results, hot_deleted, time.monotonic() - started)
    return result, str(result)


def cmd_stream(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    """One streaming offload pass (PIP-76), then hot copies past their deletion lag."""
    offloader = StreamingOffloader(rt, owner=f"cli:{socket.gethostname()}:{os.getpid()}")
    result = stream_topic(rt, offloader, args.topic, close_now=args.close_now)
    return result, str(result)


def cmd_plan(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    """The batches an `offload_ledgers` run would take, checked by the DAG form's model."""
    names = ("topic", "up_to_ledger", "batch_size", "batch_bytes")
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if args.no_byte_limit:
        given["batch_bytes"] = None
    params = OffloadRunParams.parse(given)
    batches = plan_batches(
        rt.metadata, params.topic, params.up_to_ledger, params.batch_size, params.batch_bytes
    )
    return {"params": params, "batches": batches}, _listing(map(str, batches), "(nothing due)")


def cmd_read(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    entries: list[dict[str, Any]] = []
    for entry_id, payload in TopicReader(rt).read(
        args.topic, args.ledger, args.first, args.last, Source(args.source)
    ):
        item = {
            "entry_id": entry_id,
            "size": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest(),
        }
        if args.payload:
            item["payload_b64"] = base64.b64encode(payload).decode()
        entries.append(item)
    text = "\n".join(f"{e['entry_id']:>8} {e['size']:>8} {e['sha256'][:16]}" for e in entries)
    return entries, text


def cmd_checksum(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    result = TopicReader(rt).checksum(args.topic, Source(args.source))
    return result, str(result)


def cmd_gc(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    run = collect_garbage(rt, partial(process_deletions, limit=args.limit))
    return run, str(run)


# --- rewrites: compaction and format migration (rewrite/) -----------------------------------
def cmd_rewrite(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    """Compact small objects or migrate formats, checked by the DAG form's model."""
    given: dict[str, Any] = {"mode": args.mode, "topics": args.topics or None}
    for name in ("target_bytes", "small_bytes", "max_groups"):
        if getattr(args, name) is not None:
            given[name] = getattr(args, name)
    if args.ledgers is not None:
        given["first_ledger"], given["last_ledger"] = parse_ledger_range(args.ledgers)
    given["dry_run"] = args.dry_run
    params = RewriteParams.parse(given)
    owner = f"cli:{socket.gethostname()}:{os.getpid()}"
    report = run_rewrite(rt, params, owner=owner)
    report.raise_for_failure()  # the report is printed first (see main), then the error
    return report, str(report)


# --- scrub: read every offloaded object, repair from the hot tier (scrub/) ----------------
def cmd_scrub(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    report = run_scrub(rt, args.topics or None, repair=args.repair, report_path=args.report)
    report.raise_for_failure()  # the report is printed first (see main), then the error
    return report, str(report)


# --- orphan sweep, metadata snapshots and rebuild (gc/, metadata/snapshot.py, recovery/) ----
def cmd_scan(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    result = sweep(rt.metadata, rt.stores, rt.settings, dry_run=True)
    result.raise_for_errors()
    return result, str(result)


def cmd_sweep(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    result = sweep(rt.metadata, rt.stores, rt.settings)
    result.raise_for_errors()
    return result, str(result)


def cmd_store_list(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    stores = list_stores(rt)
    return stores, _listing(map(str, stores), "(no stores recorded)")


def cmd_store_retire(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    result = retire_store(rt, args.store_id, args.confirm)
    return result, str(result)


def cmd_metadata_export(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    result = export_metadata(rt)
    return result, str(result)


def cmd_metadata_import(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    snapshot = import_snapshot(rt.metadata.engine, rt.objects, args.snapshot)
    return snapshot, f"imported {snapshot}"


def cmd_metadata_rebuild(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    result = rebuild_from_objects(rt.metadata.engine, rt.objects, rt.stores.default_location)
    return result, str(result)


def cmd_verify(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    report = verify_promises(rt, topic=args.topic, deep=args.deep)
    return report, str(report)


def cmd_status(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    report = status_report(rt)
    return report, str(report)


# --- retention: cuts, trim, topic delete (R1) ------------------------------------------------
def cmd_cut_create(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    cut = take_cut(rt, args.topic)
    return cut, f"cut {cut.cut_id} of {cut.topic} at {cut.position} ({cut.offset_bytes} bytes)"


def cmd_cut_list(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    cuts = rt.metadata.retention.list_cuts(args.topic)
    return cuts, _listing(map(_cut_line, cuts), "(no cuts)")


def _cut_line(cut: StreamCut) -> str:
    return f"{cut.cut_id:>8} {cut.position!s:<16} offset_bytes={cut.offset_bytes:<14} " + (
        f"created_ms={cut.created_ms}"
    )


def cmd_trim(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    target = resolve_target(rt, args.topic, cut_id=args.cut, position=args.position)
    result = trim_topic(rt, args.topic, target, dry_run=args.dry_run)
    return result, str(result)


def cmd_topic_delete(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    result = delete_topic(rt, args.name)
    return result, f"deleted topic {args.name}: " + str(result).split(": ", 1)[1]


# --- retention: apply a topic's policy once (R2) ----------------------------------------
def cmd_retention(args: argparse.Namespace, rt: Runtime) -> tuple[Any, str]:
    result = apply_retention(rt, args.topic, dry_run=args.dry_run)
    return result, f"{args.topic}: {result}"


def cmd_db_upgrade(args: argparse.Namespace, settings: Settings) -> tuple[Any, str]:
    before, after = upgrade_database(settings)
    result = {"before": before, "revision": after}
    if before == after:
        return result, f"metadata database already at revision {after}"
    return result, f"metadata database upgraded from revision {before} to {after}"


def cmd_db_check(args: argparse.Namespace, settings: Settings) -> tuple[Any, str]:
    revision = check_database(settings)  # SchemaOutOfDateError -> exit status 2
    return {"revision": revision}, f"metadata database at revision {revision} (head)"


# --- parser --------------------------------------------------------------------------------
INT64_MAX = 2**63 - 1  # ledger and entry ids are 64-bit in the format and the metadata


def ledger_or_entry_id(text: str) -> int:
    """An id as the format stores it: a signed 64-bit integer."""
    value = int(text)
    if not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise ValueError(text)
    return value


ledger_or_entry_id.__name__ = "64-bit id"  # argparse names the type in its message


def ledger_id_bound(text: str) -> int:
    """A ledger id to offload up to: 0 or more, as `plan` and the DAG form require."""
    value = ledger_or_entry_id(text)
    if value < 0:
        raise ValueError(text)
    return value


ledger_id_bound.__name__ = "ledger id (0 or more)"


def positive_int(text: str) -> int:
    """A count of 1 or more."""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


positive_int.__name__ = "positive integer"


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line with exit status 2, like every other failure."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="offloader", description=__doc__)
    debug_help = "on failure, print the traceback as well as the one-line error"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    def command(
        name: str, handler: Handler | SettingsHandler, help_: str, parent: Any = sub
    ) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=help_)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
        p.set_defaults(handler=handler)
        return p

    topic = sub.add_parser("topic", help="create, list, and set policies of topics")
    topic_sub = topic.add_subparsers(
        dest="topic_command", required=True, parser_class=OneLineParser
    )
    p = command("create", cmd_topic_create, "create a topic", topic_sub)
    p.add_argument("name")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="policy field (see 'topic policy')",
    )
    command("list", cmd_topic_list, "list topics", topic_sub)
    p = command("policy", cmd_topic_policy, "show or change a topic's policy", topic_sub)
    p.add_argument("name")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    delete_help = "delete a topic: fence its writer, delete every ledger (the name is not reused)"
    p = command("delete", cmd_topic_delete, delete_help, topic_sub)
    p.add_argument("name")

    p = command("produce", cmd_produce, "append seeded random entries to a topic")
    p.add_argument("topic")
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)

    p = command("ledgers", cmd_ledgers, "list a topic's ledgers")
    p.add_argument("topic")

    p = command("offload", cmd_offload, "offload due ledgers, then delete hot copies past lag")
    p.add_argument("topic")
    p.add_argument(
        "--up-to",
        type=ledger_id_bound,
        default=None,
        metavar="LEDGER",
        help="offload every sealed ledger with id <= LEDGER, whatever the policy",
    )

    p = command("stream", cmd_stream, "one streaming offload pass (segments across ledgers)")
    p.add_argument("topic")
    p.add_argument(
        "--close-now",
        action="store_true",
        help="complete the current segment now, whatever its size and age",
    )

    plan_help = "show the batches an offload_ledgers run would take (changes nothing)"
    p = command("plan", cmd_plan, plan_help)
    # plain ints: the run-params model (shared with the DAG form) says what is wrong
    p.add_argument("--topic", default=None, help="one topic (default: every topic)")
    p.add_argument("--up-to", dest="up_to_ledger", type=int, default=None, metavar="LEDGER")
    p.add_argument("--batch-size", type=int, default=None, metavar="N", help="default 500")
    bytes_group = p.add_mutually_exclusive_group()
    bytes_group.add_argument("--batch-bytes", type=int, default=None, metavar="N")
    bytes_group.add_argument("--no-byte-limit", action="store_true")

    p = command("read", cmd_read, "read entries of one ledger")
    p.add_argument("topic")
    p.add_argument("--ledger", type=ledger_or_entry_id, required=True)
    p.add_argument(
        "--first",
        type=ledger_or_entry_id,
        default=None,
        help="first entry id (default: the first readable one, at or above the topic's start)",
    )
    p.add_argument("--last", type=ledger_or_entry_id, default=None)
    p.add_argument("--source", choices=[s.value for s in Source], default="auto")
    p.add_argument("--payload", action="store_true", help="include payloads (base64)")

    p = command("checksum", cmd_checksum, "one digest over every readable entry")
    p.add_argument("topic")
    p.add_argument("--source", choices=[s.value for s in Source], default="auto")

    # retention (R1): stream cuts and trim
    cut = sub.add_parser("cut", help="stream cuts: positions to trim at")
    cut_sub = cut.add_subparsers(dest="cut_command", required=True, parser_class=OneLineParser)
    p = command("create", cmd_cut_create, "take a cut at the end of the sealed data", cut_sub)
    p.add_argument("topic")
    p = command("list", cmd_cut_list, "list a topic's cuts, oldest first", cut_sub)
    p.add_argument("topic")
    p = command("trim", cmd_trim, "move a topic's start forward and delete what falls below")
    p.add_argument("topic")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--cut", type=ledger_or_entry_id, metavar="ID", help="a cut's id")
    where.add_argument("--position", metavar="L:E", help="ledger id:entry id")
    p.add_argument("--dry-run", action="store_true", help="report what would go, change nothing")

    # retention (R2): apply a topic's policy once
    p = command("retention", cmd_retention, "apply a topic's retention policy once (PDP-19)")
    p.add_argument("topic")
    p.add_argument("--dry-run", action="store_true", help="say where it would trim; change nothing")

    db = sub.add_parser("db", help="metadata schema: upgrade once per release, check")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    for name, handler, help_ in (
        ("upgrade", cmd_db_upgrade, "migrate the metadata database to this release's schema"),
        ("check", cmd_db_check, "exit 0 at the head revision, 2 otherwise"),
    ):
        command(name, handler, help_, db_sub).set_defaults(without_runtime=True)

    scrub_help = (
        "read every offloaded object and check it; offload damaged ledgers again from their "
        "hot copy (exit status 2 if damage is left)"
    )
    p = command("scrub", cmd_scrub, scrub_help)
    p.add_argument("topics", nargs="*", metavar="TOPIC", help="topics to scrub (default: all)")
    p.add_argument(
        "--repair",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="offload damaged ledgers again from their hot copy (default: --repair)",
    )
    p.add_argument(
        "--dry-run",
        dest="repair",
        action="store_false",
        help="the same as --no-repair: report, change nothing",
    )
    p.add_argument("--report", metavar="PATH", default=None, help="write the JSON report here")
    command("scan", cmd_scan, "report orphaned objects and stale uploads (changes nothing)")
    command("sweep", cmd_sweep, "queue orphaned objects for deletion, abort stale uploads")
    store = sub.add_parser("store", help="recorded object stores: list, retire a dead one")
    store_sub = store.add_subparsers(
        dest="store_command", required=True, parser_class=OneLineParser
    )
    list_help = "recorded stores: reachable?, what names each (committed data, queued keys)"
    command("list", cmd_store_list, list_help, store_sub)
    retire_help = (
        "retire a store no committed data names: drop its queued deletions; scan and gc "
        "stop visiting it"
    )
    p = command("retire", cmd_store_retire, retire_help, store_sub)
    p.add_argument("store_id", type=positive_int, metavar="ID")
    p.add_argument("--confirm", type=int, default=None, metavar="ID", help="the same ID again")
    meta = sub.add_parser("metadata", help="metadata snapshots: export, import, rebuild")
    meta_sub = meta.add_subparsers(
        dest="metadata_command", required=True, parser_class=OneLineParser
    )
    command("export", cmd_metadata_export, "write a snapshot to the object store", meta_sub)
    p = command(
        "import", cmd_metadata_import, "restore a snapshot into an empty database", meta_sub
    )
    p.add_argument(
        "--snapshot", default="latest", metavar="KEY", help="snapshot key, or latest (default)"
    )
    command(
        "rebuild", cmd_metadata_rebuild, "rebuild topics and ledgers from the objects", meta_sub
    )

    p = command(
        "gc", cmd_gc, "one bounded pass over the deletion queue; records finished ledger deletions"
    )
    p.add_argument(
        "--limit",
        type=positive_int,
        default=DEFAULT_PASS_LIMIT,
        metavar="N",
        help=f"take at most N queued keys in this pass (default {DEFAULT_PASS_LIMIT})",
    )
    rewrite_help = (
        "compact small offloaded objects into segments, or migrate ledger objects between "
        "formats (v1 -> v2, v2 -> v1)"
    )
    p = command("rewrite", cmd_rewrite, rewrite_help)
    p.add_argument("topics", nargs="*", metavar="TOPIC", help="topics to rewrite (default: all)")
    p.add_argument("--mode", choices=[COMPACT, TO_V2, TO_V1], default=COMPACT)
    # plain ints: the run-params model (shared with the DAG form) says what is wrong
    p.add_argument("--target-bytes", type=int, default=None, metavar="N", help="default 128 MiB")
    p.add_argument(
        "--small-bytes",
        type=int,
        default=None,
        metavar="N",
        help="compact: objects below N bytes are candidates (default: target / 4)",
    )
    p.add_argument("--ledgers", default=None, metavar="FIRST:LAST", help="a ledger id range")
    p.add_argument("--max-groups", type=int, default=None, metavar="N", help="default 100")
    p.add_argument("--dry-run", action="store_true", help="report what would be rewritten")
    command("status", cmd_status, "counts of ledgers, attempts and queued deletions")
    verify_help = (
        "check every promise against the metadata and the object stores: exit 0 when all "
        "hold, 1 with one line per breach"
    )
    p = command("verify", cmd_verify, verify_help)
    p.add_argument("--topic", default=None, help="one topic's promises (default: every topic)")
    p.add_argument("--deep", action="store_true", help="also read and check every block")
    cli_metrics.add_arguments(command("metrics", cli_metrics.cmd_metrics, cli_metrics.HELP))
    check_levels = cli_service_levels.cmd_check_service_levels
    cli_service_levels.add_arguments(
        command("check-service-levels", check_levels, cli_service_levels.HELP)
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; any failure is one line on stderr and exit status 2."""
    args = build_parser().parse_args(argv)
    # The library logs what it recovers from; the operator sees the one line unless --debug.
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    redacting = RedactingFilter()  # credentials never printed, --debug or not
    for handler in logging.getLogger().handlers:
        handler.addFilter(redacting)
    settings: Settings | None = None
    try:
        settings = Settings()
        redacting.secrets = _secrets_of(settings)
        if getattr(args, "without_runtime", False):
            result, text = args.handler(args, settings)
        else:
            with Runtime.open(settings) as runtime:
                result, text = args.handler(args, runtime)
    except Exception as exc:
        if args.debug:
            traceback.print_exc()
        report = getattr(exc, "report", None)
        if isinstance(report, RunResult):  # a run that did its work and failed: its report
            print(json.dumps(jsonable(report), indent=2, sort_keys=True) if args.json else report)
        print(f"error: {describe_error(exc, settings)}", file=sys.stderr)
        return 2
    _print_result(json.dumps(jsonable(result), indent=2, sort_keys=True) if args.json else text)
    return int(getattr(result, "exit_status", 0))  # verify: 1 when a promise is broken


def _print_result(text: str) -> None:
    """Print the result; a reader that went away (``| head -1``) ends it quietly."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # stdout is closed at exit too: point it at /dev/null so that flush cannot fail
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _secrets_of(settings: Settings) -> list[str]:
    """The configured credentials, cut out of every log line."""
    values = (settings.s3_access_key_id, settings.s3_secret_access_key, settings.s3_session_token)
    found = [v.get_secret_value() for v in values if v is not None]
    return found + list(settings.otel_header_map().values())


if __name__ == "__main__":
    sys.exit(main())

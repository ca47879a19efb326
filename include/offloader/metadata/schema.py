"""Table definitions of the metadata store (the source of truth).

Times are integer milliseconds since the epoch (UTC) so SQLite and PostgreSQL agree. Every
mutable row carries ``version``; every change is ``UPDATE ... WHERE version = :expected``.
The migrations in ``migrations/versions`` create exactly these tables.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

# Invariant 7: where offloads went. Rows are never updated or deleted: attempts, ledgers
# and queued deletions point at them. Empty strings, not NULL, for an absent prefix or
# endpoint, so the unique constraint holds on both databases.
object_stores = Table(
    "object_stores",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("kind", String(16), nullable=False),  # file | s3
    Column("location", String(1024), nullable=False),  # root directory or bucket
    Column("prefix", String(512), nullable=False),
    Column("endpoint", String(512), nullable=False),  # never holds a credential
    Column("created_ms", BigInteger, nullable=False),
    Column("retired_ms", BigInteger),  # `offloader store retire`: the GC no longer visits it
    UniqueConstraint("kind", "location", "prefix", "endpoint", name="uq_object_stores_location"),
)

topics = Table(
    "topics",
    metadata,
    Column("name", String(512), primary_key=True),
    Column("version", Integer, nullable=False),
    Column("policy", Text, nullable=False),  # OffloadPolicy as JSON
    Column("created_ms", BigInteger, nullable=False),
    Column("next_ledger_id", BigInteger, nullable=False),
    Column("writer_epoch", BigInteger, nullable=False),
    # the first readable position (invariant 4); 0:0 until the first trim
    Column("start_ledger_id", BigInteger, nullable=False, server_default="0"),
    Column("start_entry_id", BigInteger, nullable=False, server_default="0"),
    Column("state", String(16), nullable=False, server_default="active"),  # TopicState
    Column("deleted_ms", BigInteger),
)

ledgers = Table(
    "ledgers",
    metadata,
    Column("topic", String(512), primary_key=True),
    Column("ledger_id", BigInteger, primary_key=True),
    Column("version", Integer, nullable=False),
    Column("state", String(16), nullable=False),  # LedgerState
    Column("entry_count", BigInteger, nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("sealed_ms", BigInteger),
    Column("offload_state", String(16), nullable=False),  # OffloadState
    Column("offload_epoch", BigInteger, nullable=False),
    Column("attempt_id", String(36)),  # the attempt in flight, if any
    Column("attempt_lease_ms", BigInteger),
    Column("offload_uuid", String(36)),  # the committed attempt
    Column("data_key", Text),
    Column("index_key", Text),
    Column("data_len", BigInteger),
    Column("offloaded_ms", BigInteger),
    Column("hot_state", String(16), nullable=False),  # HotState
    Column("hot_deleted_ms", BigInteger),
    Column("store_id", Integer),  # the committed offload's store (from its attempt)
    Column("deletion_state", String(16), nullable=False, server_default="none"),
    Column("deleting_ms", BigInteger),
    Column("deleted_ms", BigInteger),
    # how the committed offload is laid out: "ledger" (its own v1 objects, data_key and
    # index_key) or "stream" (its entries in offloaded segments: segment_ledgers)
    Column("offload_mode", String(16), nullable=False, server_default="ledger"),
    # finish_deleted_ledgers finds the deleting ledgers without a scan of live ones
    Index("ix_ledgers_deletion", "deletion_state", "topic", "ledger_id"),
    # the end of a topic's sealed data (its first open ledger) without a scan of history
    Index("ix_ledgers_state", "topic", "state", "ledger_id"),
    Index("ix_ledgers_hot", "topic", "hot_state"),  # planning and hot deletion
    Index("ix_ledgers_created", "topic", "created_ms"),  # backfills plan by creation time
    Index("ix_ledgers_data_key", "data_key"),  # the orphan sweep's lookups by key
    Index("ix_ledgers_index_key", "index_key"),
    ForeignKeyConstraint(["topic"], ["topics.name"]),
    ForeignKeyConstraint(["store_id"], ["object_stores.id"], name="fk_ledgers_store"),
)

offload_attempts = Table(
    "offload_attempts",
    metadata,
    Column("attempt_id", String(36), primary_key=True),
    Column("topic", String(512), nullable=False),
    Column("ledger_id", BigInteger, nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("data_key", Text, nullable=False),
    Column("index_key", Text, nullable=False),
    Column("state", String(16), nullable=False),  # AttemptState
    Column("owner", String(255), nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("finished_ms", BigInteger),
    Column("detail", Text),
    Column("store_id", Integer),  # recorded at attempts.begin: intent before effect
    Index("ix_offload_attempts_ledger", "topic", "ledger_id"),
    Index("ix_offload_attempts_data_key", "data_key"),
    Index("ix_offload_attempts_index_key", "index_key"),
    ForeignKeyConstraint(["store_id"], ["object_stores.id"], name="fk_offload_attempts_store"),
)

# PDP-19 stream cuts: positions with their time and byte offset, oldest first by id
stream_cuts = Table(
    "stream_cuts",
    metadata,
    Column("cut_id", Integer, primary_key=True, autoincrement=True),
    Column("topic", String(512), nullable=False),
    Column("ledger_id", BigInteger, nullable=False),
    Column("entry_id", BigInteger, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("offset_bytes", BigInteger, nullable=False),
    Index("ix_stream_cuts_topic", "topic", "cut_id"),
    ForeignKeyConstraint(["topic"], ["topics.name"], name="fk_stream_cuts_topic"),
)

deletion_queue = Table(
    "deletion_queue",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("object_key", Text, nullable=False),
    Column("reason", String(255), nullable=False),
    Column("attempt_id", String(36)),
    Column("state", String(16), nullable=False),  # pending | done
    Column("enqueued_ms", BigInteger, nullable=False),
    Column("tries", Integer, nullable=False),
    Column("next_try_ms", BigInteger, nullable=False),
    Column("last_error", Text),
    Column("done_ms", BigInteger),
    Column("store_id", Integer),  # the store the key lives in; the GC deletes there
    # the deleting ledger that waits for this key (retention); NULL for attempts' leftovers
    Column("topic", String(512)),
    Column("ledger_id", BigInteger),
    Index("ix_deletion_queue_due", "state", "next_try_ms"),
    Index("ix_deletion_queue_ledger", "topic", "ledger_id", "state"),
    Index("ix_deletion_queue_object_key", "object_key"),
    ForeignKeyConstraint(["store_id"], ["object_stores.id"], name="fk_deletion_queue_store"),
)


# PIP-76 streaming offload. One row per topic that ever streamed: the pass that owns the
# topic's stream holds ``epoch`` (PDP-34 fencing: every commit of a pass checks it in the
# same transaction) until ``lease_until_ms`` (database clock).
streams = Table(
    "streams",
    metadata,
    Column("topic", String(512), primary_key=True),
    Column("version", Integer, nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("owner", String(255), nullable=False),
    Column("lease_ms", BigInteger, nullable=False),  # how long each commit renews for
    Column("lease_until_ms", BigInteger),  # NULL: released
    Column("claimed_ms", BigInteger),  # when the last pass claimed it: passes' interval
    Column("created_ms", BigInteger, nullable=False),
    ForeignKeyConstraint(["topic"], ["topics.name"], name="fk_streams_topic"),
)

# A segment: entries from ``begin`` on, of one or more ledgers, in one data object (a
# multipart upload that stays open across passes) and one index object. Keys and store
# are recorded when it is assigned, before its upload starts (invariant 1).
segments = Table(
    "segments",
    metadata,
    Column("segment_id", String(36), primary_key=True),
    Column("topic", String(512), nullable=False),
    Column("seq", BigInteger, nullable=False),  # the topic's segments in assignment order
    Column("version", Integer, nullable=False),
    Column("state", String(16), nullable=False),  # SegmentState
    Column("epoch", BigInteger, nullable=False),  # the stream epoch that assigned it
    Column("assigned_ms", BigInteger, nullable=False),
    Column("offloaded_ms", BigInteger),
    Column("finished_ms", BigInteger),  # failed, replaced or deleted
    Column("detail", Text),
    Column("begin_ledger_id", BigInteger, nullable=False),
    Column("begin_entry_id", BigInteger, nullable=False),
    # the last position in its recorded parts (NULL: no part yet)
    Column("end_ledger_id", BigInteger),
    Column("end_entry_id", BigInteger),
    # history split at assignment: the pass closes the segment exactly after this position
    Column("planned_end_ledger_id", BigInteger),
    Column("planned_end_entry_id", BigInteger),
    Column("data_key", Text, nullable=False),
    Column("index_key", Text, nullable=False),
    Column("store_id", Integer, nullable=False),
    Column("upload_id", Text),  # the open multipart upload, once created
    Column("data_len", BigInteger, nullable=False),  # bytes in recorded parts
    Column("replaces", String(36)),  # the failed segment it took over from
    # who writes it: "stream" (the topic's stream, fenced by its epoch) or "rewrite"
    # (compaction or format migration, fenced by lease_until_ms while it is written)
    Column("origin", String(16), nullable=False, server_default="stream"),
    Column("lease_until_ms", BigInteger),  # a rewrite's lease (database clock); NULL: stream
    UniqueConstraint("topic", "seq", name="uq_segments_topic_seq"),
    Index("ix_segments_state", "state", "topic"),
    Index("ix_segments_data_key", "data_key"),
    Index("ix_segments_index_key", "index_key"),
    ForeignKeyConstraint(["topic"], ["topics.name"], name="fk_segments_topic"),
    ForeignKeyConstraint(["store_id"], ["object_stores.id"], name="fk_segments_store"),
)

# The parts of a segment's upload, recorded as each is uploaded: a pass that dies resumes
# after the last one. ``blocks`` is the parts' block table (JSON), which the index needs
# and which S3 cannot give back before the upload completes.
segment_parts = Table(
    "segment_parts",
    metadata,
    Column("segment_id", String(36), primary_key=True),
    Column("part_number", Integer, primary_key=True),
    Column("etag", String(255), nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("length", BigInteger, nullable=False),
    Column("last_ledger_id", BigInteger, nullable=False),
    Column("last_entry_id", BigInteger, nullable=False),
    Column("blocks", Text, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    ForeignKeyConstraint(["segment_id"], ["segments.segment_id"], name="fk_segment_parts_segment"),
)

# Which entries of which ledger an offloaded segment holds (a ledger's pieces), written when
# it is committed: reads find a streamed ledger's pieces here, retention the segments a
# ledger keeps alive. Its SQL name stays segment_ledgers (the schema is a contract).
pieces = Table(
    "segment_ledgers",
    metadata,
    Column("segment_id", String(36), primary_key=True),
    Column("ledger_id", BigInteger, primary_key=True),
    Column("topic", String(512), nullable=False),
    Column("first_entry_id", BigInteger, nullable=False),
    Column("last_entry_id", BigInteger, nullable=False),
    Index("ix_segment_ledgers_ledger", "topic", "ledger_id"),
    ForeignKeyConstraint(
        ["segment_id"], ["segments.segment_id"], name="fk_segment_ledgers_segment"
    ),
)

"""Streaming offload (PIP-76): streams (the pass epoch and lease per topic), segments, their
recorded parts, the ledger ranges of offloaded segments, and each ledger's offload mode.

Existing ledgers were offloaded whole: their mode is 'ledger'. No topic streams yet, so
the new tables start empty.

Revision ID: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("ledgers") as batch:
        batch.add_column(
            sa.Column("offload_mode", sa.String(16), nullable=False, server_default="ledger")
        )
    op.create_table(
        "streams",
        sa.Column("topic", sa.String(512), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("lease_ms", sa.BigInteger, nullable=False),
        sa.Column("lease_until_ms", sa.BigInteger),
        sa.Column("claimed_ms", sa.BigInteger),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.ForeignKeyConstraint(["topic"], ["topics.name"], name="fk_streams_topic"),
    )
    op.create_table(
        "segments",
        sa.Column("segment_id", sa.String(36), primary_key=True),
        sa.Column("topic", sa.String(512), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("assigned_ms", sa.BigInteger, nullable=False),
        sa.Column("offloaded_ms", sa.BigInteger),
        sa.Column("finished_ms", sa.BigInteger),
        sa.Column("detail", sa.Text),
        sa.Column("begin_ledger_id", sa.BigInteger, nullable=False),
        sa.Column("begin_entry_id", sa.BigInteger, nullable=False),
        sa.Column("end_ledger_id", sa.BigInteger),
        sa.Column("end_entry_id", sa.BigInteger),
        sa.Column("planned_end_ledger_id", sa.BigInteger),
        sa.Column("planned_end_entry_id", sa.BigInteger),
        sa.Column("data_key", sa.Text, nullable=False),
        sa.Column("index_key", sa.Text, nullable=False),
        sa.Column("store_id", sa.Integer, nullable=False),
        sa.Column("upload_id", sa.Text),
        sa.Column("data_len", sa.BigInteger, nullable=False),
        sa.Column("replaces", sa.String(36)),
        sa.UniqueConstraint("topic", "seq", name="uq_segments_topic_seq"),
        sa.ForeignKeyConstraint(["topic"], ["topics.name"], name="fk_segments_topic"),
        sa.ForeignKeyConstraint(["store_id"], ["object_stores.id"], name="fk_segments_store"),
    )
    op.create_index("ix_segments_state", "segments", ["state", "topic"])
    op.create_index("ix_segments_data_key", "segments", ["data_key"])
    op.create_index("ix_segments_index_key", "segments", ["index_key"])
    op.create_table(
        "segment_parts",
        sa.Column("segment_id", sa.String(36), primary_key=True),
        sa.Column("part_number", sa.Integer, primary_key=True),
        sa.Column("etag", sa.String(255), nullable=False),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("length", sa.BigInteger, nullable=False),
        sa.Column("last_ledger_id", sa.BigInteger, nullable=False),
        sa.Column("last_entry_id", sa.BigInteger, nullable=False),
        sa.Column("blocks", sa.Text, nullable=False),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.ForeignKeyConstraint(
            ["segment_id"], ["segments.segment_id"], name="fk_segment_parts_segment"
        ),
    )
    op.create_table(
        "segment_ledgers",
        sa.Column("segment_id", sa.String(36), primary_key=True),
        sa.Column("ledger_id", sa.BigInteger, primary_key=True),
        sa.Column("topic", sa.String(512), nullable=False),
        sa.Column("first_entry_id", sa.BigInteger, nullable=False),
        sa.Column("last_entry_id", sa.BigInteger, nullable=False),
        sa.ForeignKeyConstraint(
            ["segment_id"], ["segments.segment_id"], name="fk_segment_ledgers_segment"
        ),
    )
    op.create_index("ix_segment_ledgers_ledger", "segment_ledgers", ["topic", "ledger_id"])


def downgrade() -> None:
    op.drop_table("segment_ledgers")
    op.drop_table("segment_parts")
    op.drop_table("segments")
    op.drop_table("streams")
    with op.batch_alter_table("ledgers") as batch:
        batch.drop_column("offload_mode")

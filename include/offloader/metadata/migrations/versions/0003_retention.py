"""Retention: stream cuts, the topic's start position and state, ledger deletion states,
and the ledger a queued deletion belongs to.

Existing rows get the defaults: every topic starts at 0:0 and is active, every ledger is
live (deletion_state 'none'), every queued key belongs to no ledger.

Revision ID: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


KEY_INDEXES = (
    ("ledgers", "data_key"),
    ("ledgers", "index_key"),
    ("offload_attempts", "data_key"),
    ("offload_attempts", "index_key"),
    ("deletion_queue", "object_key"),
)


def upgrade() -> None:
    with op.batch_alter_table("topics") as batch:
        batch.add_column(
            sa.Column("start_ledger_id", sa.BigInteger, nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("start_entry_id", sa.BigInteger, nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("state", sa.String(16), nullable=False, server_default="active"))
        batch.add_column(sa.Column("deleted_ms", sa.BigInteger))
    with op.batch_alter_table("ledgers") as batch:
        batch.add_column(
            sa.Column("deletion_state", sa.String(16), nullable=False, server_default="none")
        )
        batch.add_column(sa.Column("deleting_ms", sa.BigInteger))
        batch.add_column(sa.Column("deleted_ms", sa.BigInteger))
    op.create_index("ix_ledgers_deletion", "ledgers", ["deletion_state", "topic", "ledger_id"])
    op.create_index("ix_ledgers_state", "ledgers", ["topic", "state", "ledger_id"])
    op.create_index("ix_ledgers_hot", "ledgers", ["topic", "hot_state"])
    with op.batch_alter_table("deletion_queue") as batch:
        batch.add_column(sa.Column("topic", sa.String(512)))
        batch.add_column(sa.Column("ledger_id", sa.BigInteger))
    op.create_index("ix_deletion_queue_ledger", "deletion_queue", ["topic", "ledger_id", "state"])
    op.create_table(
        "stream_cuts",
        sa.Column("cut_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("topic", sa.String(512), nullable=False),
        sa.Column("ledger_id", sa.BigInteger, nullable=False),
        sa.Column("entry_id", sa.BigInteger, nullable=False),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.Column("offset_bytes", sa.BigInteger, nullable=False),
        sa.ForeignKeyConstraint(["topic"], ["topics.name"], name="fk_stream_cuts_topic"),
    )
    op.create_index("ix_stream_cuts_topic", "stream_cuts", ["topic", "cut_id"])
    # the orphan sweep asks, per listing page, which keys anything references
    for table, column in KEY_INDEXES:
        op.create_index(f"ix_{table}_{column}", table, [column])


def downgrade() -> None:
    for table, column in KEY_INDEXES:
        op.drop_index(f"ix_{table}_{column}", table)
    op.drop_table("stream_cuts")
    op.drop_index("ix_deletion_queue_ledger", "deletion_queue")
    with op.batch_alter_table("deletion_queue") as batch:
        batch.drop_column("ledger_id")
        batch.drop_column("topic")
    op.drop_index("ix_ledgers_hot", "ledgers")
    op.drop_index("ix_ledgers_state", "ledgers")
    op.drop_index("ix_ledgers_deletion", "ledgers")
    with op.batch_alter_table("ledgers") as batch:
        batch.drop_column("deleted_ms")
        batch.drop_column("deleting_ms")
        batch.drop_column("deletion_state")
    with op.batch_alter_table("topics") as batch:
        batch.drop_column("deleted_ms")
        batch.drop_column("state")
        batch.drop_column("start_entry_id")
        batch.drop_column("start_ledger_id")

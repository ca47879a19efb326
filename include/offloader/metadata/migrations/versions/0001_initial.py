"""Initial schema: topics, ledgers, offload attempts, deletion queue.

Revision ID: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "topics",
        sa.Column("name", sa.String(512), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("policy", sa.Text, nullable=False),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.Column("next_ledger_id", sa.BigInteger, nullable=False),
        sa.Column("writer_epoch", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "ledgers",
        sa.Column("topic", sa.String(512), primary_key=True),
        sa.Column("ledger_id", sa.BigInteger, primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("entry_count", sa.BigInteger, nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.Column("sealed_ms", sa.BigInteger),
        sa.Column("offload_state", sa.String(16), nullable=False),
        sa.Column("offload_epoch", sa.BigInteger, nullable=False),
        sa.Column("attempt_id", sa.String(36)),
        sa.Column("attempt_lease_ms", sa.BigInteger),
        sa.Column("offload_uuid", sa.String(36)),
        sa.Column("data_key", sa.Text),
        sa.Column("index_key", sa.Text),
        sa.Column("data_len", sa.BigInteger),
        sa.Column("offloaded_ms", sa.BigInteger),
        sa.Column("hot_state", sa.String(16), nullable=False),
        sa.Column("hot_deleted_ms", sa.BigInteger),
        sa.ForeignKeyConstraint(["topic"], ["topics.name"]),
    )
    op.create_table(
        "offload_attempts",
        sa.Column("attempt_id", sa.String(36), primary_key=True),
        sa.Column("topic", sa.String(512), nullable=False),
        sa.Column("ledger_id", sa.BigInteger, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("data_key", sa.Text, nullable=False),
        sa.Column("index_key", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.Column("finished_ms", sa.BigInteger),
        sa.Column("detail", sa.Text),
    )
    op.create_index("ix_offload_attempts_ledger", "offload_attempts", ["topic", "ledger_id"])
    op.create_table(
        "deletion_queue",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("object_key", sa.Text, nullable=False),
        sa.Column("reason", sa.String(255), nullable=False),
        sa.Column("attempt_id", sa.String(36)),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("enqueued_ms", sa.BigInteger, nullable=False),
        sa.Column("tries", sa.Integer, nullable=False),
        sa.Column("next_try_ms", sa.BigInteger, nullable=False),
        sa.Column("last_error", sa.Text),
        sa.Column("done_ms", sa.BigInteger),
    )
    op.create_index("ix_deletion_queue_due", "deletion_queue", ["state", "next_try_ms"])


def downgrade() -> None:
    op.drop_table("deletion_queue")
    op.drop_table("offload_attempts")
    op.drop_table("ledgers")
    op.drop_table("topics")

"""Record where each offload went: object_stores, and store_id on attempts, ledgers and
queued deletions (invariant 7).

Rows written before this revision get ``store_id`` NULL here: a migration cannot know the
settings. ``offloader db upgrade`` (offloader.metadata.migrate.upgrade) fills them, in the
same transaction, with the store configured when it runs, which is the store those rows
were written to. See docs/OPERATIONS.md, "Upgrading".

Revision ID: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_STORE_FKS = {
    "ledgers": "fk_ledgers_store",
    "offload_attempts": "fk_offload_attempts_store",
    "deletion_queue": "fk_deletion_queue_store",
}


def upgrade() -> None:
    op.create_table(
        "object_stores",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("location", sa.String(1024), nullable=False),
        sa.Column("prefix", sa.String(512), nullable=False),
        sa.Column("endpoint", sa.String(512), nullable=False),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.UniqueConstraint(
            "kind", "location", "prefix", "endpoint", name="uq_object_stores_location"
        ),
    )
    for table, fk in _STORE_FKS.items():
        # batch: SQLite cannot add a foreign key by ALTER; it recreates the table instead
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("store_id", sa.Integer))
            batch.create_foreign_key(fk, "object_stores", ["store_id"], ["id"])


def downgrade() -> None:
    for table, fk in _STORE_FKS.items():
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(fk, type_="foreignkey")
            batch.drop_column("store_id")
    op.drop_table("object_stores")

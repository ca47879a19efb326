"""Rewrites (compaction and v1 -> v2 format migration): a segment's origin and its lease.

A segment is written either by the topic's stream (``origin`` 'stream', fenced by the
stream's epoch) or by a rewrite run (``origin`` 'rewrite', fenced by its own lease in
``lease_until_ms`` on the database's clock while it is written). Existing segments were
all written by the stream; their lease is the stream's, so theirs stays NULL.

Revision ID: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("segments") as batch:
        batch.add_column(
            sa.Column("origin", sa.String(16), nullable=False, server_default="stream")
        )
        batch.add_column(sa.Column("lease_until_ms", sa.BigInteger))


def downgrade() -> None:
    with op.batch_alter_table("segments") as batch:
        batch.drop_column("lease_until_ms")
        batch.drop_column("origin")

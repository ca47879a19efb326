"""An index on each topic's ledgers by creation time, for backfills of a past period.

``offload_historical`` plans the ledgers created inside a run's data interval; without
this index each daily run would read the topic's whole hot set to find one day's ledgers.
Existing rows need nothing: ``created_ms`` has been recorded since 0001.

Revision ID: 0004
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_ledgers_created", "ledgers", ["topic", "created_ms"])


def downgrade() -> None:
    op.drop_index("ix_ledgers_created", "ledgers")

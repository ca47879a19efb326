"""A recorded store can be retired (`offloader store retire`): the sweep and the GC no
longer visit it. Existing stores are live: the column is NULL for them.

Revision ID: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("object_stores") as batch:
        batch.add_column(sa.Column("retired_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("object_stores") as batch:
        batch.drop_column("retired_ms")

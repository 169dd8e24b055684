"""the gateway that admitted each request (issue 11: several gateways on one PostgreSQL)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Rows written before are one gateway's: NULL, which that gateway's recovery after a crash still takes.
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gateway", sa.String(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("gateway")

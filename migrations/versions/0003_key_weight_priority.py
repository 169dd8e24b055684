"""api key weight and priority class (fair share, issue 12)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing keys become what a new key is by default: weight 1, interactive.
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("weight", sa.Float(), server_default="1", nullable=False))
        batch_op.add_column(sa.Column("priority", sa.String(length=16), server_default="interactive", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("priority")
        batch_op.drop_column("weight")

"""the backend that served each request (issue 11: remote engines behind the gateway)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Rows written before were all the embedded engine's, but nothing recorded it: NULL, not a guess.
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("backend", sa.String(length=100), nullable=True))
        # The history's backend filter, newest first, and the list of backends seen (a skip over its keys).
        batch_op.create_index("ix_requests_backend_arrival_at", ["backend", "arrival_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_index("ix_requests_backend_arrival_at")
        batch_op.drop_column("backend")

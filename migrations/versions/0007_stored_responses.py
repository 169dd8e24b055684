"""stored Responses API answers (issue 27): GET /v1/responses/{id} and previous_response_id

Revision ID: 0007
Revises: 0006
Create Date: 2027-01-15
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEY_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # web/models.py's BigCount, as api_keys.id has it


def upgrade() -> None:
    op.create_table(
        "stored_responses",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("key_id", KEY_ID, nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("conversation", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["key_id"], ["api_keys.id"], name=op.f("fk_stored_responses_key_id_api_keys"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stored_responses")),
    )
    with op.batch_alter_table("stored_responses", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_stored_responses_key_id"), ["key_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_stored_responses_created_at"), ["created_at"], unique=False)


def downgrade() -> None:
    op.drop_table("stored_responses")

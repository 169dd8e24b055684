"""single sign-on (issue 30): the link from an identity provider's (issuer, sub) to a person's account

Revision ID: 0011
Revises: 0009
Create Date: 2027-02-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # web/models.py's BigCount


def upgrade() -> None:
    op.create_table(
        "oidc_identities",
        sa.Column("issuer", sa.String(length=255), nullable=False),
        sa.Column("subject", sa.String(length=255), nullable=False),
        sa.Column("user_id", ID, nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_oidc_identities_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("issuer", "subject", name=op.f("pk_oidc_identities")),
    )
    with op.batch_alter_table("oidc_identities", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_oidc_identities_user_id"), ["user_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("oidc_identities", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_oidc_identities_user_id"))
    op.drop_table("oidc_identities")

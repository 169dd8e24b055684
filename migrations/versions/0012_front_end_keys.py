"""trusted front ends: a key whose requests name their end users, each a tenant with their own quota

Revision ID: 0012
Revises: 0011
Create Date: 2027-02-10
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # web/models.py's BigCount


def upgrade() -> None:
    # Existing keys stay what they were: untrusted, their own tenant.
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("front_end", sa.Boolean(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("front_end_accounts", sa.Boolean(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("front_end_plan_id", ID, nullable=True))
        batch_op.create_foreign_key(
            batch_op.f("fk_api_keys_front_end_plan_id_plans"),
            "plans",
            ["front_end_plan_id"],
            ["id"],
            ondelete="SET NULL",
        )
    op.create_table(
        "end_users",
        sa.Column("id", ID, nullable=False),
        sa.Column("key_id", ID, nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("plan_id", ID, nullable=True),
        sa.Column("period_start", sa.DateTime(), nullable=False),
        sa.Column("used_tokens", ID, nullable=False),
        sa.Column("reserved_tokens", ID, nullable=False),
        sa.Column("total_tokens", ID, nullable=False),
        sa.Column("total_requests", ID, nullable=False),
        sa.Column("first_seen_at", sa.DateTime(), nullable=False),
        sa.Column("last_used_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["key_id"], ["api_keys.id"], name=op.f("fk_end_users_key_id_api_keys"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["plan_id"], ["plans.id"], name=op.f("fk_end_users_plan_id_plans"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_end_users")),
    )
    with op.batch_alter_table("end_users", schema=None) as batch_op:
        batch_op.create_index("uq_end_users_key_id_name", ["key_id", "name"], unique=True)
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("end_user_id", ID, nullable=True))
        batch_op.create_index("ix_requests_end_user_id_arrival_at", ["end_user_id", "arrival_at"], unique=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_requests_end_user_id_end_users"), "end_users", ["end_user_id"], ["id"], ondelete="SET NULL"
        )


def downgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_requests_end_user_id_end_users"), type_="foreignkey")
        batch_op.drop_index("ix_requests_end_user_id_arrival_at")
        batch_op.drop_column("end_user_id")
    op.drop_table("end_users")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_api_keys_front_end_plan_id_plans"), type_="foreignkey")
        batch_op.drop_column("front_end_plan_id")
        batch_op.drop_column("front_end_accounts")
        batch_op.drop_column("front_end")

"""people (issue 29): users with roles and plans, their usage, server-side sessions, invites, personal keys; the
admin credential becomes the first admin user

Revision ID: 0008
Revises: 0007
Create Date: 2027-01-20
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # web/models.py's BigCount


def upgrade() -> None:
    op.create_table(
        "plans",
        sa.Column("id", ID, nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("max_tokens_per_request", ID, nullable=True),
        sa.Column("quota_tokens", ID, nullable=True),
        sa.Column("quota_period", sa.String(length=8), nullable=False),
        sa.Column("max_concurrent", ID, nullable=True),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("priority", sa.String(length=16), nullable=False),
        sa.Column("models", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_plans")),
        sa.UniqueConstraint("name", name=op.f("uq_plans_name")),
    )
    users = op.create_table(
        "users",
        sa.Column("id", ID, nullable=False),
        sa.Column("username", sa.String(length=64), nullable=False),
        sa.Column("password_hash", sa.String(length=256), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("suspended", sa.Boolean(), nullable=False),
        sa.Column("plan_id", ID, nullable=True),
        sa.Column("overrides", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], name=op.f("fk_users_plan_id_plans"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("username", name=op.f("uq_users_username")),
    )
    op.create_table(
        "user_usage",
        sa.Column("user_id", ID, nullable=False),
        sa.Column("period_start", sa.DateTime(), nullable=False),
        sa.Column("used_tokens", ID, nullable=False),
        sa.Column("reserved_tokens", ID, nullable=False),
        sa.Column("total_tokens", ID, nullable=False),
        sa.Column("total_requests", ID, nullable=False),
        sa.Column("last_used_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_user_usage_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_user_usage")),
    )
    op.create_table(
        "web_sessions",
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("user_id", ID, nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_web_sessions_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_web_sessions")),
    )
    with op.batch_alter_table("web_sessions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_web_sessions_user_id"), ["user_id"], unique=False)
    op.create_table(
        "invites",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("plan_id", ID, nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("used_by", ID, nullable=True),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], name=op.f("fk_invites_plan_id_plans"), ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["used_by"], ["users.id"], name=op.f("fk_invites_used_by_users"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("token_hash", name=op.f("pk_invites")),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("user_id", ID, nullable=True))
        batch_op.create_index(batch_op.f("ix_api_keys_user_id"), ["user_id"], unique=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_api_keys_user_id_users"), "users", ["user_id"], ["id"], ondelete="CASCADE"
        )
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("user_id", ID, nullable=True))
        batch_op.create_index("ix_requests_user_id_arrival_at", ["user_id", "arrival_at"], unique=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_requests_user_id_users"), "users", ["user_id"], ["id"], ondelete="SET NULL"
        )
    # The admin credential moves into a users row, its scrypt hash as it is (nothing is re-hashed or learnt).
    credentials = sa.table(
        "admin_credentials",
        sa.column("username", sa.String),
        sa.column("password_hash", sa.String),
        sa.column("updated_at", sa.DateTime),
    )
    moved = op.get_bind().execute(sa.select(credentials)).all()
    if moved:
        op.bulk_insert(
            users,
            [
                {
                    "username": row.username,
                    "password_hash": row.password_hash,
                    "role": "admin",
                    "suspended": False,
                    "plan_id": None,
                    "overrides": "{}",
                    "created_at": row.updated_at,
                    "updated_at": row.updated_at,
                }
                for row in moved
            ],
        )
        admin_ids = op.get_bind().execute(sa.select(users.c.id, users.c.created_at)).all()
        usage = sa.table(
            "user_usage",
            sa.column("user_id", ID),
            sa.column("period_start", sa.DateTime),
            sa.column("used_tokens", ID),
            sa.column("reserved_tokens", ID),
            sa.column("total_tokens", ID),
            sa.column("total_requests", ID),
        )
        op.bulk_insert(
            usage,
            [
                {
                    "user_id": row.id,
                    "period_start": row.created_at,
                    "used_tokens": 0,
                    "reserved_tokens": 0,
                    "total_tokens": 0,
                    "total_requests": 0,
                }
                for row in admin_ids
            ],
        )
    op.drop_table("admin_credentials")


def downgrade() -> None:
    credentials = op.create_table(
        "admin_credentials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("username", sa.String(length=64), nullable=False),
        sa.Column("password_hash", sa.String(length=256), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_admin_credentials")),
        sa.UniqueConstraint("username", name=op.f("uq_admin_credentials_username")),
    )
    users = sa.table(
        "users",
        sa.column("username", sa.String),
        sa.column("password_hash", sa.String),
        sa.column("role", sa.String),
        sa.column("updated_at", sa.DateTime),
    )
    admin = op.get_bind().execute(sa.select(users).where(users.c.username == "admin", users.c.role == "admin")).first()
    if admin is not None:
        op.bulk_insert(
            credentials,
            [{"username": "admin", "password_hash": admin.password_hash, "updated_at": admin.updated_at}],
        )
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_requests_user_id_users"), type_="foreignkey")
        batch_op.drop_index("ix_requests_user_id_arrival_at")
        batch_op.drop_column("user_id")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_api_keys_user_id_users"), type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_api_keys_user_id"))
        batch_op.drop_column("user_id")
    op.drop_table("invites")
    op.drop_table("web_sessions")
    op.drop_table("user_usage")
    op.drop_table("users")
    op.drop_table("plans")

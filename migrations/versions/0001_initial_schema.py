"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "admin_credentials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("username", sa.String(length=64), nullable=False),
        sa.Column("password_hash", sa.String(length=256), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_admin_credentials")),
        sa.UniqueConstraint("username", name=op.f("uq_admin_credentials_username")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.Column("max_tokens_per_request", sa.Integer(), nullable=True),
        sa.Column("quota_tokens", sa.Integer(), nullable=True),
        sa.Column("quota_period", sa.String(length=8), nullable=False),
        sa.Column("max_concurrent", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_table(
        "engine_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("running", sa.Integer(), nullable=False),
        sa.Column("waiting", sa.Integer(), nullable=False),
        sa.Column("kv_usage", sa.Float(), nullable=False),
        sa.Column("kv_blocks_used", sa.Integer(), nullable=False),
        sa.Column("kv_blocks_total", sa.Integer(), nullable=False),
        sa.Column("memory_kind", sa.String(length=8), nullable=False),
        sa.Column("memory_total_bytes", sa.Integer(), nullable=False),
        sa.Column("memory_free_bytes", sa.Integer(), nullable=False),
        sa.Column("weights_bytes", sa.Integer(), nullable=False),
        sa.Column("kv_pool_bytes", sa.Integer(), nullable=False),
        sa.Column("queue_wait_p95_s", sa.Float(), nullable=True),
        sa.Column("tokens_per_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_engine_samples")),
    )
    with op.batch_alter_table("engine_samples", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_engine_samples_at"), ["at"], unique=False)

    op.create_table(
        "key_usage",
        sa.Column("key_id", sa.Integer(), nullable=False),
        sa.Column("period_start", sa.DateTime(), nullable=False),
        sa.Column("used_tokens", sa.Integer(), nullable=False),
        sa.Column("reserved_tokens", sa.Integer(), nullable=False),
        sa.Column("total_tokens", sa.Integer(), nullable=False),
        sa.Column("total_requests", sa.Integer(), nullable=False),
        sa.Column("last_used_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["key_id"], ["api_keys.id"], name=op.f("fk_key_usage_key_id_api_keys"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_key_usage")),
    )
    op.create_table(
        "requests",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.Integer(), nullable=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("endpoint", sa.String(length=64), nullable=False),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("finish_reason", sa.String(length=16), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("max_tokens_requested", sa.Integer(), nullable=True),
        sa.Column("max_tokens_applied", sa.Integer(), nullable=True),
        sa.Column("reserved_tokens", sa.Integer(), nullable=False),
        sa.Column("arrival_at", sa.DateTime(), nullable=False),
        sa.Column("admitted_at", sa.DateTime(), nullable=True),
        sa.Column("first_token_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("queue_wait_s", sa.Float(), nullable=True),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("tpot_s", sa.Float(), nullable=True),
        sa.Column("e2e_s", sa.Float(), nullable=True),
        sa.Column("client_addr", sa.String(length=64), nullable=True),
        sa.Column("user", sa.String(length=256), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("prompt_text", sa.Text(), nullable=True),
        sa.Column("response_text", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["key_id"], ["api_keys.id"], name=op.f("fk_requests_key_id_api_keys"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_requests")),
    )
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.create_index("ix_requests_arrival_at", ["arrival_at"], unique=False)
        batch_op.create_index("ix_requests_key_id_arrival_at", ["key_id", "arrival_at"], unique=False)
        batch_op.create_index("ix_requests_status", ["status"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_index("ix_requests_status")
        batch_op.drop_index("ix_requests_key_id_arrival_at")
        batch_op.drop_index("ix_requests_arrival_at")

    op.drop_table("requests")
    op.drop_table("key_usage")
    with op.batch_alter_table("engine_samples", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_engine_samples_at"))

    op.drop_table("engine_samples")
    op.drop_table("api_keys")
    op.drop_table("admin_credentials")

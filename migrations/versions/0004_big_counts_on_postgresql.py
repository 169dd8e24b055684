"""token and byte counts as BIGINT on PostgreSQL (issue 11)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# PostgreSQL's INTEGER stops at 2**31 - 1: a quota of billions of tokens, a total served or 24 GiB of RAM in bytes
# would not fit, nor would a key id that a URL names (the API takes any 64-bit id and answers 404). SQLite's INTEGER
# already holds 64 bits, so there is nothing to do there (and no table to rebuild).
COLUMNS = {
    "api_keys": ("id", "max_tokens_per_request", "quota_tokens", "max_concurrent"),
    "key_usage": ("key_id", "used_tokens", "reserved_tokens", "total_tokens", "total_requests"),
    "requests": (
        "key_id",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "max_tokens_requested",
        "max_tokens_applied",
        "reserved_tokens",
    ),
    "engine_samples": (
        "kv_blocks_used",
        "kv_blocks_total",
        "memory_total_bytes",
        "memory_free_bytes",
        "weights_bytes",
        "kv_pool_bytes",
    ),
}


def _retype(old: sa.types.TypeEngine[int], new: sa.types.TypeEngine[int]) -> None:
    if op.get_context().dialect.name == "sqlite":
        return
    for table, columns in COLUMNS.items():
        for column in columns:
            op.alter_column(table, column, existing_type=old, type_=new)


def upgrade() -> None:
    _retype(sa.Integer(), sa.BigInteger())


def downgrade() -> None:
    # Fails where a stored count no longer fits 32 bits: a downgrade must not truncate usage silently.
    _retype(sa.BigInteger(), sa.Integer())

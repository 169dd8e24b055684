"""Scheduling in pure Python (no torch): requests, tenants, limits, the KV block bookkeeping, the waiting queues,
fair share and the scheduler itself."""

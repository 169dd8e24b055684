"""Embeddings for every API dialect that asks for them: admitted, embedded by the embedding model's process, and
settled in the ledger (web/embeddings/service.py)."""

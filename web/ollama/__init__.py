"""Ollama's API (/api/*) as a thin dialect over the shared generation pipeline and the embedding service."""

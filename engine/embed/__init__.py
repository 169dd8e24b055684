"""Embeddings: a small encoder model (sentence-transformers layout or a plain HF encoder) served beside the chat
model in its own process; `AsyncEmbeddingClient` is its async face."""

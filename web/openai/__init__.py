"""The OpenAI-compatible /v1 API: request bodies, chat template, responses and SSE chunks."""

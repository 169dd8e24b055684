"""The OpenAI-compatible /v1 API (chat/completions, completions, models): its bodies into the pipeline's Ask, its
responses and SSE chunks."""

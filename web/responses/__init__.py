"""The OpenAI Responses API (/v1/responses): a dialect over the shared generation pipeline, and its stored answers."""

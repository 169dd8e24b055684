"""The OpenAI Responses API (/v1/responses, and GET/DELETE of stored answers): a dialect over the shared
generation pipeline."""

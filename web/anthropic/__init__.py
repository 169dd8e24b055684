"""The Anthropic Messages API (/v1/messages, /v1/messages/count_tokens): its bodies into the pipeline's Ask, its
responses and stream events."""

"""The request history: one row per request, written in batches, queried by the admin API; the Responses API's
stored answers."""

"""The Litestar side of the appliance: the OpenAI-compatible API, keys and quotas, history, pages, jobs."""

"""The admin console: login, live engine panel, charts and diagnosis, request history, API keys."""

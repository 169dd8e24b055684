"""API keys and token quotas: storage, authentication, reservation and settlement, the admin API."""

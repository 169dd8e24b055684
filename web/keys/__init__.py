"""API keys and token quotas: storage, authentication, reservation and settlement, the admin API, and trusted
front ends (a key whose requests name their end users, each a tenant with a quota of their own)."""

"""The audit export: the request history as an append-only, hash-chained JSON Lines file that an organisation keeps
as its record of AI use, and the check that finds the first line anyone changed."""

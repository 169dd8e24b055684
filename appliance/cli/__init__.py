"""The `appliance` command and its sub-commands (chat, keys, status, models, audit)."""

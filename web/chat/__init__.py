"""The chat page: a browser chat client of the appliance's own /v1 API."""

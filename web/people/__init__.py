"""People: accounts with roles and plans, their passwords, sign-in and server-side sessions, invites, and their
saved conversations."""

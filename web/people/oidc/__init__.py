"""Single sign-on with the organisation's OpenID Connect provider: its settings, the flow, and the accounts it makes."""

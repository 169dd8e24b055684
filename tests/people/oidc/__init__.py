"""Single sign-on against a real OpenID Provider (panva's oidc-provider, run by Node)."""

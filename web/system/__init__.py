"""Health, readiness, Prometheus metrics, the admin credential and the live stats API."""

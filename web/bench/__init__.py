"""The streaming benchmark command: `python -m web.bench` (see __main__); `web.bench.load` is its load generator."""

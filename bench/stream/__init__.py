"""The streaming benchmark command: `python -m bench.stream` (see __main__); `bench.stream.load` is its load
generator."""

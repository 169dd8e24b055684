"""Every benchmark, each a command that prints numbers: the engine's (bench.engine), the stream's (bench.stream),
the served comparison, fair share and the gateway's cost, and their shell wrappers."""

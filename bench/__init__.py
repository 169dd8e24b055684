"""Every benchmark, each a command that prints numbers: the engine's (bench.engine), the stream's (bench.stream),
the embedding model's (bench.embed), the audit export's (bench.audit), the served comparison, fair share and the
gateway's cost, and their shell wrappers."""

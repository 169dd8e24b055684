"""One request's path through the engine: admission (quota, history row), the stream, the drain."""

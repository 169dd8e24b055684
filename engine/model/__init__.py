"""The model side of a step: loading, presets and model sources, the KV pool, paged attention, the own forward
and the runner."""

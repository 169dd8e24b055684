"""The one generation pipeline every API dialect runs: decoded body -> prompt and sampling -> admission (quota,
history row) -> backend -> deltas streamed or collected -> settled; and the drain."""

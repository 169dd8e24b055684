"""Text in and out: prompt ids as the served API makes them, and from logits to text: the sampler, penalties,
guided decoding and the incremental detokenizer."""

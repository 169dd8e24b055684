"""From logits to text: the sampler, penalties, guided decoding and the incremental detokenizer."""

"""A request's first delta carries its timings so far (issue 17 H1): a stream the client drops before the end
still knows when the engine scheduled it."""

from __future__ import annotations

from engine import AsyncEngineClient, EngineConfig, SamplingParams

CONFIG = EngineConfig(model="random:tiny", quantization="none", device="cpu", num_kv_blocks=64)


async def test_the_first_delta_says_when_the_request_was_scheduled() -> None:
    client = AsyncEngineClient(CONFIG, auto_restart=False)
    await client.start()
    try:
        stream = client.generate([5, 6, 7], SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))
        first = await anext(stream)
        await stream.aclose()  # the client went away: no final delta will come
    finally:
        await client.shutdown()
    t = first.timings
    assert not first.finished and t is not None and t.finished is None
    assert t.scheduled is not None and t.first_token is not None
    assert t.arrival <= t.scheduled <= t.first_token

"""The async client: streaming deltas, abort frees blocks, a killed engine process gives one clear error
and a restart brings service back."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import pytest_asyncio

from engine import AsyncEngineClient, EngineConfig, EngineDeadError, QueueFullError, SamplingParams

# One event loop for the module: the shared client below lives on it.
pytestmark = pytest.mark.asyncio(loop_scope="module")
CONFIG = EngineConfig(model="random:tiny", quantization="none", device="cpu", num_kv_blocks=256, max_queue=4)


async def wait_for(predicate, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client() -> AsyncEngineClient:
    """One engine for the tests that leave it serving (the one that kills it restarts it): each start spawns an
    engine process, seconds of CI. The tests that watch a start or a crash's auto-restart make their own."""
    c = AsyncEngineClient(CONFIG, auto_restart=False)
    await c.start()
    yield c  # type: ignore[misc]
    await c.shutdown()


async def test_stream_then_final_with_usage_and_timings(client: AsyncEngineClient) -> None:
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outs = [o async for o in client.generate("Hello, who are you?", params)]
    assert len(outs) >= 2 and outs[-1].finished and not any(o.finished for o in outs[:-1])
    final = outs[-1]
    assert final.finish_reason == "length"
    assert final.usage is not None and final.usage.completion_tokens == 12
    assert sum(len(o.token_ids) for o in outs) == 12
    t = final.timings
    assert t is not None and t.arrival <= t.scheduled <= t.first_token <= t.finished  # type: ignore[operator]
    text = "".join(o.text for o in outs)
    ids = [i for o in outs for i in o.token_ids]
    assert text == client.tokenizer.decode(ids, skip_special_tokens=True)


async def test_closing_the_iterator_aborts_and_frees_blocks(client: AsyncEngineClient) -> None:
    params = SamplingParams(max_tokens=1500, temperature=0.0, ignore_eos=True)
    stream = client.generate(list(range(100, 400)), params)
    await stream.__anext__()
    await wait_for(lambda: (s := client.stats()) is not None and s.kv_blocks_used > 0)
    await stream.aclose()
    await wait_for(lambda: (s := client.stats()) is not None and s.running == 0 and s.kv_blocks_used == 0)


async def test_queue_bound_is_a_typed_error(client: AsyncEngineClient) -> None:
    params = SamplingParams(max_tokens=1500, temperature=0.0, ignore_eos=True)
    # The core drains its whole inbox before it steps, so all but max_queue (4) of these find the queue full.
    streams = [client.generate(list(range(100, 200)), params) for _ in range(200)]
    results = await asyncio.gather(*(s.__anext__() for s in streams), return_exceptions=True)
    assert any(isinstance(r, QueueFullError) for r in results)
    for s in streams:
        await s.aclose()


async def test_killed_engine_gives_clear_error_then_restarts(client: AsyncEngineClient) -> None:
    params = SamplingParams(max_tokens=1500, temperature=0.0, ignore_eos=True)
    stream = client.generate("tell me a long story", params)
    await stream.__anext__()
    assert client.pid is not None
    os.kill(client.pid, signal.SIGKILL)
    with pytest.raises(EngineDeadError):
        async for _ in stream:
            pass
    await wait_for(lambda: client.state == "down")
    with pytest.raises(EngineDeadError):
        await client.generate("hi", params).__anext__()
    await client.restart()
    outs = [o async for o in client.generate("hi", SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))]
    assert outs[-1].finished and outs[-1].usage is not None and outs[-1].usage.completion_tokens == 3


async def test_auto_restart_after_crash() -> None:
    c = AsyncEngineClient(CONFIG, auto_restart=True)
    await c.start()
    try:
        first_pid = c.pid
        assert first_pid is not None
        os.kill(first_pid, signal.SIGKILL)
        # "down" lasts only until the restart begins, so watch for a new ready process instead.
        await wait_for(lambda: c.state == "ready" and c.pid != first_pid, 120)
        assert c.restarts == 1 and c.last_error is not None and "exited" in c.last_error
    finally:
        await c.shutdown()


async def test_a_hung_engine_is_told_apart_by_its_silent_heartbeat(client: AsyncEngineClient) -> None:
    assert client.pid is not None
    await wait_for(lambda: client.healthy(max_silence=2.0), 10)
    os.kill(client.pid, signal.SIGSTOP)  # alive but not looping: what a hung CUDA call looks like
    try:
        await wait_for(lambda: not client.healthy(max_silence=2.0), 10)
        assert client.state == "ready"  # not dead, so only the heartbeat can tell
    finally:
        os.kill(client.pid, signal.SIGCONT)
    await wait_for(lambda: client.healthy(max_silence=2.0), 10)


async def test_the_loads_progress_reaches_the_client_while_it_loads() -> None:
    """Issue 16: the load's progress lines are what /ready, systemd's STATUS and the console say while loading."""
    c = AsyncEngineClient(CONFIG, auto_restart=False)
    seen: list[str] = []
    dispatch = c._dispatch

    def recording(msg: object, generation: int) -> None:
        # Read after each message, not by polling: the last lines of a fast load (a bf16 tiny model's are ~15 ms apart)
        # arrive within one turn of the loop, and a poll between them saw only the first lines.
        dispatch(msg, generation)  # type: ignore[arg-type]
        if c.load_step is not None and (not seen or seen[-1] != c.load_step):
            seen.append(c.load_step)

    c._dispatch = recording  # type: ignore[method-assign]
    try:
        await c.start()
        assert "sizing the KV cache" in seen, seen
        assert c.load_step is None  # ready: no load step to report any more
    finally:
        await c.shutdown()

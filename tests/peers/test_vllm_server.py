"""The session's real vLLM server (tests/peers/vllm.py) is what the suite's backend tests and the benchmark need:
it answers with its key only, lists the served name with its context, and streams a token-id prompt through the
gateway's upstream client with vLLM's own usage."""

from __future__ import annotations

import httpx
import pytest

from engine import SamplingParams
from tests.peers.vllm import MAX_MODEL_LEN, VllmServer
from web.backends.upstream import Upstream


@pytest.mark.slow
async def test_the_session_server_serves_token_ids_with_its_key(vllm_server: VllmServer) -> None:
    async with httpx.AsyncClient() as http:
        refused = await http.get(f"{vllm_server.base_url}/v1/models", headers={"Authorization": "Bearer sk-wrong"})
        assert refused.status_code == 401
        upstream = Upstream(vllm_server.base_url, vllm_server.api_key, http)
        assert [(m.id, m.max_model_len) for m in await upstream.models()] == [(vllm_server.model, MAX_MODEL_LEN)]
        prompt = [1, 504, 3458, 282, 4649, 314]  # token ids of the bundled model's vocabulary
        params = SamplingParams(max_tokens=5, ignore_eos=True)
        outs = [o async for o in upstream.generate(vllm_server.model, prompt, params, "r-1")]
    final = outs[-1]
    assert final.finished and final.usage is not None
    assert final.usage.prompt_tokens == len(prompt) and final.usage.completion_tokens == 5
    assert sum(len(o.token_ids) for o in outs) == 5 and all(t >= 0 for o in outs for t in o.token_ids)
    assert (vllm_server.model_dir / "config.json").is_file()

from typing import Any

from tests.web.conftest import MODEL, bearer, new_key


async def test_chat_round_trip(client: Any) -> None:
    key = await new_key(client)
    response = await client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        headers=bearer(key),
    )
    assert response.status_code == 200, response.text
    print(response.json())

"""The console shows who uses the engine (issue 12): per key, running and waiting requests and its share of the
last minute's tokens against its weight's share; the diagnosis names a key that holds most seats while others wait."""

from __future__ import annotations

import html as markup
import re
from types import SimpleNamespace

from engine import TenantStats
from tests.web.conftest import ADMIN, InLoop, sign_in
from web.console.tenants import KeyShare, key_shares, seat_holder


async def _key_id(in_loop: InLoop, name: str, **fields: object) -> int:
    response = await in_loop.http.post("/admin/api/keys", json={"name": name, **fields}, headers=ADMIN)
    assert response.status_code == 201, response.text
    return int(response.json()["info"]["id"])


def _cells(html: str, name: str) -> dict[str, str]:
    row = re.search(rf'<tr data-key="{re.escape(name)}">(.*?)</tr>', html, re.S)
    assert row, html
    return dict(re.findall(r'data-metric="([^"]+)"[^>]*>([^<]*)<', row.group(1)))


async def test_the_dashboard_shows_each_busy_keys_seats_and_share_and_names_the_seat_holder(in_loop: InLoop) -> None:
    scraper = await _key_id(in_loop, "<b>scraper</b>")  # a key's name is shown as text, never as markup
    alice = await _key_id(in_loop, "alice", weight=3)
    in_loop.fake.tenant_stats = [
        TenantStats(str(scraper), 1.0, "interactive", running=14, waiting=10, tokens_per_s=900.0, service=5.0),
        TenantStats(str(alice), 3.0, "interactive", running=2, waiting=3, tokens_per_s=100.0, service=1.0),
    ]
    await sign_in(in_loop.http)
    panel = await in_loop.http.get("/admin", headers={"HX-Request": "true", "HX-Target": "key-shares"})
    assert panel.status_code == 200, panel.text
    html = panel.text
    assert "<b>scraper</b>" not in html and "&lt;b&gt;scraper&lt;/b&gt;" in html
    assert _cells(html, "&lt;b&gt;scraper&lt;/b&gt;") == {
        "key-running": "14",
        "key-waiting": "10",
        "key-token-share": "90%",
        "key-weight-share": "25%",
    }
    assert _cells(html, "alice")["key-weight-share"] == "75%"
    assert html.index("scraper") < html.index("alice")  # most seats first

    diagnosis = await in_loop.http.get("/admin", headers={"HX-Request": "true", "HX-Target": "diagnosis"})
    assert "<b>" not in diagnosis.text
    text = markup.unescape(diagnosis.text)
    assert "Key '<b>scraper</b>' holds 14 of the 16 seats in use" in text, text
    assert "while 3 request(s) of other keys wait" in text
    assert "--class batch" in text


async def test_no_key_is_named_when_the_seats_are_shared_or_nobody_else_waits(in_loop: InLoop) -> None:
    await sign_in(in_loop.http)
    in_loop.fake.tenant_stats = [
        TenantStats("1", 1.0, "interactive", running=8, waiting=0, tokens_per_s=10.0, service=1.0),
        TenantStats("2", 1.0, "interactive", running=8, waiting=4, tokens_per_s=10.0, service=1.0),
    ]
    diagnosis = await in_loop.http.get("/admin", headers={"HX-Request": "true", "HX-Target": "diagnosis"})
    assert "holds" not in diagnosis.text  # 8 of 16 each: the key with waiting requests is not the seat holder
    quiet = await in_loop.http.get("/admin", headers={"HX-Request": "true", "HX-Target": "key-shares"})
    in_loop.fake.tenant_stats = []
    empty = await in_loop.http.get("/admin", headers={"HX-Request": "true", "HX-Target": "key-shares"})
    assert 'data-key="1"' in quiet.text  # a tenant id no key has any more is shown as the id
    assert "No key has used the engine in the last minute." in empty.text


def test_a_key_alone_on_the_engine_is_not_a_seat_holder_and_shares_wait_for_tokens() -> None:
    alone = [KeyShare("a", "interactive", 1.0, 16, 5, 0.0, None, 1.0)]
    assert seat_holder(alone) is None  # nobody else waits behind it: its own queue is not unfair
    assert key_shares(None, {}) == []  # no engine stats yet
    batch_and_interactive = [
        TenantStats("1", 1.0, "batch", 1, 0, 0.0, 0.0),
        TenantStats("2", 1.0, "interactive", 1, 0, 0.0, 0.0),
    ]
    shares = key_shares(SimpleNamespace(tenants=batch_and_interactive), {})  # type: ignore[arg-type]
    assert [s.weight_share for s in shares] == [1.0, 1.0]  # the share is within each class
    assert all(s.token_share is None for s in shares)  # no tokens yet: no share to show

"""``limit``/``continue`` from the proxy's cache, and kube-apiserver's validation of list parameters."""

from __future__ import annotations

import base64

import httpx
import orjson

from range_filter_proxy import CacheSettings, create_app
from range_filter_proxy.paging import PagingSettings
from tests.range_filter_proxy.fakes import PODS, FakeUpstream
from tests.range_filter_proxy.helpers import assert_statuses, async_test, serve


def _fast() -> CacheSettings:
    return CacheSettings(bookmark_interval=0.1, consistent_read_timeout=0.2, rv_wait_timeout=0.3)


async def _all_pages(client: httpx.AsyncClient, limit: int, **params: str) -> tuple[list[str], set[str], int]:
    """Follow continue tokens; (names in order, resourceVersions seen, pages)."""
    names: list[str] = []
    rvs: set[str] = set()
    pages = 0
    cont: str | None = None
    while True:
        query = {**params, "limit": str(limit)} | ({"continue": cont} if cont else {})
        resp = await client.get("/api/v1/pods", params=query)
        assert resp.status_code == 200, resp.text
        doc = resp.json()
        pages += 1
        assert len(doc["items"]) <= limit
        names += [i["metadata"]["name"] for i in doc["items"]]
        rvs.add(doc["metadata"]["resourceVersion"])
        cont = doc["metadata"].get("continue")
        if not cont:
            return names, rvs, pages


@async_test()
async def test_pages_are_consistent_at_the_first_pages_rv_while_objects_change() -> None:
    fake = FakeUpstream()
    for i in range(25):
        fake.create(PODS, f"p{i:02d}")
    async with serve(create_app(fake, settings=_fast())) as url, httpx.AsyncClient(base_url=url) as client:
        whole = (await client.get("/api/v1/pods")).json()
        first = (await client.get("/api/v1/pods", params={"limit": "10"})).json()
        assert [i["metadata"]["name"] for i in first["items"]] == [f"p{i:02d}" for i in range(10)]
        assert first["metadata"]["remainingItemCount"] == 15
        token = first["metadata"]["continue"]
        # The token is opaque to clients but not a server secret: it carries no object data.
        assert "p09" not in token
        # Changes after the first page do not show up in the later pages of that list.
        fake.create(PODS, "p05a")
        fake.delete(PODS, "p20")
        second = (await client.get("/api/v1/pods", params={"limit": "10", "continue": token})).json()
        assert [i["metadata"]["name"] for i in second["items"]] == [f"p{i:02d}" for i in range(10, 20)]
        assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        third = (
            await client.get("/api/v1/pods", params={"limit": "10", "continue": second["metadata"]["continue"]})
        ).json()
        assert [i["metadata"]["name"] for i in third["items"]] == [f"p{i:02d}" for i in range(20, 25)]
        assert "continue" not in third["metadata"]
        assert len(whole["items"]) == 25 and "continue" not in whole["metadata"]

        # A new list sees the new state; pages of 500 (client-go's reflector) come back whole.
        names, rvs, pages = await _all_pages(client, 7)
        assert names == sorted(names) and len(names) == 25 and "p05a" in names and "p20" not in names
        assert len(rvs) == 1 and pages == 4
        names, _, pages = await _all_pages(client, 500)
        assert len(names) == 25 and pages == 1
        # limit=0 means no limit
        zero = (await client.get("/api/v1/pods", params={"limit": "0"})).json()
        assert len(zero["items"]) == 25 and "continue" not in zero["metadata"]


@async_test()
async def test_continue_token_expires_with_410_and_bad_tokens_are_400() -> None:
    fake = FakeUpstream()
    for i in range(6):
        fake.create(PODS, f"p{i}")
    app = create_app(fake, settings=_fast(), paging=PagingSettings(snapshot_seconds=60, max_snapshots=2))
    async with serve(app) as url, httpx.AsyncClient(base_url=url) as client:
        old = (await client.get("/api/v1/pods", params={"limit": "2"})).json()["metadata"]["continue"]
        for n in range(3):  # newer lists at newer RVs push the oldest snapshot out
            fake.create(PODS, f"q{n}")
            fresh = (await client.get("/api/v1/pods", params={"limit": "2"})).json()
        resp = await client.get("/api/v1/pods", params={"limit": "2", "continue": old})
        assert resp.status_code == 410, resp.text
        body = resp.json()
        assert body["kind"] == "Status" and body["reason"] == "Expired" and "too old" in body["message"]
        # the newest token still works
        resp = await client.get("/api/v1/pods", params={"limit": "2", "continue": fresh["metadata"]["continue"]})
        assert resp.status_code == 200

        forged = base64.urlsafe_b64encode(orjson.dumps({"v": "other", "rv": 1})).decode()
        selector_token = fresh["metadata"]["continue"]
        cases: list[tuple[dict[str, str], int, str]] = [
            ({"limit": "abc"}, 400, "limit"),
            ({"limit": "-1"}, 400, "limit"),
            ({"limit": "1.5"}, 400, "limit"),
            ({"continue": "%%%not-base64"}, 400, "continue key is not valid"),
            ({"continue": forged}, 400, "continue key is not valid"),
            ({"continue": selector_token, "resourceVersion": "5"}, 400, "resource version is not allowed"),
            (
                {"continue": selector_token, "resourceVersion": "5", "resourceVersionMatch": "NotOlderThan"},
                422,
                "forbidden when continue is provided",
            ),
            ({"continue": selector_token, "labelSelector": "a=b"}, 400, "other selectors"),
            ({"timeoutSeconds": "abc"}, 400, "timeoutSeconds"),
            ({"timeoutSeconds": "-5"}, 400, "timeoutSeconds"),
            ({"resourceVersionMatch": "exact", "resourceVersion": "1"}, 422, "supported values"),
        ]
        await assert_statuses(client, "/api/v1/pods", cases)

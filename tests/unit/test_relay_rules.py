"""The relay rules both relays follow (the proxy's pass-through, the external endpoint), sans I/O."""

from __future__ import annotations

import pytest

from hashing import ShardBy
from rangeshard.core import http1, relay
from rangeshard.core.ownertoken import OwnerToken
from rangeshard.core.requestinfo import classify

CLIENT = [
    ("Host", "proxy:8001"),
    ("Connection", "keep-alive"),
    ("Transfer-Encoding", "chunked"),
    ("Accept", "application/vnd.kubernetes.protobuf, application/json"),
    ("Accept-Encoding", "gzip"),
    ("Authorization", "Bearer client"),
    ("User-Agent", "kopf/1.37"),
]


def _names(headers: list[tuple[str, str]]) -> list[str]:
    return [k.lower() for k, _ in headers]


def test_hop_by_hop_headers_never_pass_and_protobuf_leaves_accept() -> None:
    out = relay.request_headers(CLIENT)
    assert _names(out) == ["accept", "accept-encoding", "authorization", "user-agent"]
    assert dict(out)["Accept"] == "application/json"
    assert relay.json_accept("application/vnd.kubernetes.protobuf") == "application/json"


@pytest.mark.parametrize(
    ("kwargs", "authorization"),
    [
        ({}, ["Bearer client"]),  # the proxy in none/delegate mode; the endpoint without a token file
        ({"client_authorization": False}, []),  # the proxy in static mode: its own credentials go upstream
        ({"authorization": "Bearer manager"}, ["Bearer manager"]),  # the endpoint with the manager's token
    ],
)
def test_authorization_is_kept_dropped_or_replaced(kwargs: dict[str, object], authorization: list[str]) -> None:
    out = relay.request_headers(CLIENT, **kwargs)  # type: ignore[arg-type]
    assert [v for k, v in out if k.lower() == "authorization"] == authorization


def test_a_relay_that_reads_the_answer_asks_for_no_compression() -> None:
    assert "accept-encoding" not in _names(relay.request_headers(CLIENT, identity=True))


def test_response_headers() -> None:
    upstream = [("Content-Type", "application/json"), ("Content-Length", "12"), ("Transfer-Encoding", "chunked")]
    assert relay.response_headers(upstream) == [("Content-Type", "application/json"), ("Content-Length", "12")]
    assert relay.response_headers(upstream, framed=True) == [("Content-Type", "application/json")]


def test_which_requests_have_a_body() -> None:
    assert relay.has_body("POST", {}) and relay.has_body("DELETE", {})
    assert not relay.has_body("GET", {}) and not relay.has_body("OPTIONS", {})
    assert relay.has_body("GET", {"content-length": "3"}) and relay.has_body("GET", {"transfer-encoding": "chunked"})


def test_which_writes_carry_the_token_and_how() -> None:
    rules = {"gadgets.bars.example.org": ShardBy.UID, "configmaps": ShardBy.OWNER}
    gadgets = "/apis/bars.example.org/v1/namespaces/a/gadgets"
    assert relay.write_rule(rules, classify("POST", gadgets, {})) is ShardBy.UID
    assert relay.write_rule(rules, classify("PATCH", f"{gadgets}/g/status", {})) is ShardBy.UID
    assert relay.write_rule(rules, classify("DELETE", "/api/v1/namespaces/a/configmaps/c", {})) is ShardBy.OWNER
    assert relay.write_rule(rules, classify("GET", f"{gadgets}/g", {})) is None, "reads carry no token"
    assert relay.write_rule(rules, classify("POST", "/api/v1/namespaces/a/events", {})) is None, "not sharded"
    assert relay.write_rule(rules, classify("POST", "/apis", {})) is None

    token = OwnerToken("gadget", "m-1", 0xABC, 4)
    declared = relay.declare([*CLIENT, ("X-Rangeshard-Shard-By", "namespace")], token, ShardBy.UID)
    agents = [v for k, v in declared if k.lower() == "user-agent"]
    assert agents == [f"{token.user_agent()} kopf/1.37 rangeshard-shard-by/uid"]
    assert [v for k, v in declared if k.lower() == "x-rangeshard-shard-by"] == ["uid"], "the client's own is replaced"
    assert OwnerToken.parse(agents[0]) == token
    assert relay.declared_rule({k.lower(): v for k, v in declared}) is ShardBy.UID
    assert relay.declared_rule({"user-agent": agents[0]}) is ShardBy.UID, "the audit log's copy, in the agent"
    assert relay.declared_rule({"user-agent": "kopf/1.37"}) is None
    with pytest.raises(ValueError, match="uid"):
        relay.declared_rule({"x-rangeshard-shard-by": "name"})
    by_label = relay.declare(CLIENT, token, ShardBy.LABEL, "tekton.dev/pipelineRun")
    label_agent = dict(by_label)["User-Agent"]
    assert label_agent.endswith("rangeshard-shard-by/label rangeshard-shard-label/tekton.dev%2FpipelineRun")
    assert dict(by_label)["X-Rangeshard-Shard-Label"] == "tekton.dev/pipelineRun"
    assert relay.declared_label({"user-agent": label_agent}) == "tekton.dev/pipelineRun", "the audit log's copy"
    assert relay.declared_label({k.lower(): v for k, v in by_label}) == "tekton.dev/pipelineRun"
    with pytest.raises(ValueError, match="is not a label key"):
        relay.declared_label({"x-rangeshard-shard-label": "a b"})
    no_agent = relay.declare([], token, ShardBy.OWNER)
    assert dict(no_agent)["User-Agent"] == f"{token.user_agent()} rangeshard-shard-by/owner"


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://127.0.0.1:8001", http1.Origin(False, "127.0.0.1", 8001, "127.0.0.1:8001", "")),
        ("https://api.example:6443/prefix/", http1.Origin(True, "api.example", 6443, "api.example:6443", "/prefix")),
        ("https://user:secret@h", http1.Origin(True, "h", 443, "h", "")),  # credentials are never sent
        ("http://[::1]:2", http1.Origin(False, "::1", 2, "[::1]:2", "")),
    ],
)
def test_where_our_http_clients_send(url: str, origin: http1.Origin) -> None:
    assert http1.Origin.parse(url) == origin


@pytest.mark.parametrize("url", ["ftp://h", "http://", "127.0.0.1:8001", "http://h:99999"])
def test_an_origin_that_is_not_http_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        http1.Origin.parse(url)


def test_the_request_head_of_both_clients() -> None:
    head = http1.request_head("GET", "/api/v1/pods?watch=true", "h:1", [("Authorization", "Bearer t")])
    assert head == b"GET /api/v1/pods?watch=true HTTP/1.1\r\nHost: h:1\r\nAuthorization: Bearer t\r\n\r\n"
    # A header with a line break is refused, and the error names the header, never its value (a token).
    for bad in [("Authorization", "Bearer secret\r\nX-Evil: 1"), ("X\nEvil", "v")]:
        with pytest.raises(ValueError, match="line break") as info:
            http1.request_head("GET", "/", "h", [bad])
        assert "secret" not in str(info.value)

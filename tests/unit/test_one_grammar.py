"""Every input the components share has one grammar and one answer: each disagreeing input fed to every component.

The inputs are those issue 47 found read differently: an upstream URL with credentials, a key prefix with a
trailing slash, ``pods.v1``, ``/openapi/v2`` read by a user without groups, ``--port 70000``, and a protobuf body
whose ``metadata`` field is repeated. No processes: the commands run in-process (typer's runner), the servers'
authorization as their own code (the proxy's ``ProxyAuth``, the local API server's ASGI middleware).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from controller_manager.config import ManagerConfig, ShardResourceSection, with_overrides
from hashing import canonical_via, root_path
from hashing.resources import parse_resource_name
from local_apiserver.cli import LocalApiServerFlags
from local_apiserver.middleware import Authenticate
from range_filter_proxy.auth import AuthMode, AuthSettings, ProxyAuth
from range_filter_proxy.cli import ProxyFlags
from range_filter_proxy.upstream import load_upstream_config
from rangeshard.cli.main import app
from rangeshard.core import policy
from rangeshard.core.errors import ConfigError
from rangeshard.core.kubeapi import ApiError, Attributes, StaticTokens, UserInfo, parse_token_file
from rangeshard.core.protobuf_decode import decode_object, object_identity
from rangeshard.core.settings import read_flags
from tests.protobuf_wire import body, field

MINIMAL: dict[str, Any] = {"controllers": {"replicaset": None}}


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize("command", [["proxy", "--upstream", "http://127.0.0.1:1"], ["local-apiserver"]])
@pytest.mark.parametrize("port", ["70000", "-1", "0"])
def test_a_port_out_of_range_exits_2_naming_the_flag_for_both_servers(command: list[str], port: str) -> None:
    code, output = _cli(*command, "--port", port)
    assert code == 2, output
    assert "error: --port: " in output and "Traceback" not in output


def test_an_upstream_url_with_credentials_is_refused_by_the_proxy_as_by_the_manager(tmp_path: Path) -> None:
    url = "https://user:pass@host"
    code, output = _cli("proxy", "--upstream", url)
    assert code == 2 and "error: --upstream: URL must not contain credentials" in output, output
    assert "pass" not in output.replace("user:password@", "")  # the password is never echoed
    with pytest.raises(ConfigError, match="--upstream: URL must not contain credentials"):
        load_upstream_config(url)
    with pytest.raises(ConfigError, match=r"^--proxy: https://\*\*\*@host: URL must not contain credentials"):
        with_overrides(ManagerConfig.model_validate(MINIMAL), proxy=url)
    with pytest.raises(ValueError, match="URL must not contain credentials"):
        ManagerConfig.model_validate({**MINIMAL, "proxy": {"url": url}})
    for bad in ("http://host/?q=1", "http://host/#f", "ftp://host"):
        code, output = _cli("proxy", "--upstream", bad)
        assert code == 2 and "error: --upstream: " in output, (bad, output)
        with pytest.raises(ValueError, match="URL"):
            ManagerConfig.model_validate({**MINIMAL, "proxy": {"url": bad}})


@pytest.mark.parametrize(("given", "read"), [("/rangeshard/", "/rangeshard"), ("/a/b", "/a/b"), ("/x/y/", "/x/y")])
def test_a_key_prefix_reads_the_same_in_the_proxy_the_manager_and_the_local_apiserver(given: str, read: str) -> None:
    proxy = read_flags(ProxyFlags, {"upstream": "http://h", "etcd": "http://e:2379", "registry_prefix": given})
    manager = ManagerConfig.model_validate({**MINIMAL, "registryPrefix": given})
    local = read_flags(LocalApiServerFlags, {"prefix": given})
    assert proxy.registry_prefix == manager.registry_prefix == local.prefix == read


@pytest.mark.parametrize("bad", ["rangeshard", "/", "//", "/a//b", "/a b"])
def test_a_bad_key_prefix_is_refused_by_every_component_with_one_message(bad: str) -> None:
    messages = set()
    with pytest.raises(ConfigError) as proxy:
        read_flags(ProxyFlags, {"upstream": "http://h", "registry_prefix": bad})
    messages.add(proxy.value.problems[0].removeprefix("--registry-prefix: "))
    with pytest.raises(ConfigError) as local:
        read_flags(LocalApiServerFlags, {"prefix": bad})
    messages.add(local.value.problems[0].removeprefix("--prefix: "))
    with pytest.raises(ValueError, match="registryPrefix") as manager:
        ManagerConfig.model_validate({**MINIMAL, "registryPrefix": bad})
    assert len(messages) == 1 and messages.pop() in str(manager.value)


def test_pods_v1_is_one_resource_for_every_parser() -> None:
    # As kubectl reads it (schema.ParseResourceArg): two parts are resource.group, so the group is "v1".
    assert parse_resource_name("pods.v1") == ("pods", None, "v1")
    assert canonical_via(["pods.v1"]) == ("pods.v1",)
    assert ShardResourceSection.model_validate({"resource": "pods.v1"}).resource == "pods.v1"
    entry = ShardResourceSection.model_validate({"resource": "configmaps", "by": "root", "via": ["pods.v1"]})
    assert entry.via == ["pods.v1"]
    assert entry.path == root_path(["pods.v1"]) == "object.metadata.ownerReferences.root(pods.v1).uid"
    assert read_flags(ProxyFlags, {"upstream": "http://h", "resources": "pods.v1"}).resources == ("pods.v1",)
    # With a version and a group, the version is dropped everywhere.
    assert canonical_via(["replicasets.v1.apps"]) == ("replicasets.apps",)
    entry = ShardResourceSection.model_validate({"resource": "pods", "by": "root", "via": ["replicasets.v1.apps"]})
    assert entry.via == ["replicasets.apps"] and entry.path == root_path(["replicasets.apps"])
    for bad in ("Pods", "pods..apps", "", "pods."):
        with pytest.raises(ValueError):
            parse_resource_name(bad)
        with pytest.raises(ValueError):
            canonical_via([bad])
        with pytest.raises(ConfigError, match="--resources"):
            read_flags(ProxyFlags, {"upstream": "http://h", "resources": f"pods,{bad}" if bad else "pods,Pods"})


TOKENS = 't-none,nobody,u1\nt-reader,reader,u2,"rangeshard:readers"\n'


def _proxy_answer(token: str, attrs: Attributes) -> int:
    auth = ProxyAuth(AuthSettings(mode=AuthMode.STATIC, users=parse_token_file(TOKENS)))
    try:
        asyncio.run(auth.check(f"Bearer {token}", attrs))
    except ApiError as e:
        return e.code
    return 200


class _TokensOnly:
    """What the local API server's authentication reads of its state: a token file, no ServiceAccounts, no mode."""

    authorization_mode = ""

    def __init__(self, authenticator: StaticTokens) -> None:
        self.authenticator = authenticator

    def user_of_token(self, token: str) -> None:
        return None

    async def authorize(self, user: UserInfo, attrs: Attributes) -> tuple[bool, str]:
        return policy.authorize(user, attrs)  # State.authorize without --authorization-mode


def _local_answer(token: str, method: str, path: str) -> int:
    async def ok(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def call() -> int:
        asgi = Authenticate(ok, _TokensOnly(StaticTokens(parse_token_file(TOKENS))))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://local") as client:
            answer = await client.request(method, path, headers={"Authorization": f"Bearer {token}"})
            return answer.status_code

    return asyncio.run(call())


@pytest.mark.parametrize(
    ("token", "path", "want"),
    [
        ("t-none", "/openapi/v2", 200),
        ("t-none", "/openapi/v3/apis/apps/v1", 200),
        ("t-none", "/version", 200),
        ("t-none", "/apis/apps", 200),
        ("t-none", "/metrics", 200),
        ("t-none", "/logs/kube-apiserver.log", 403),
        ("t-none", "/debug/pprof", 403),
        ("t-reader", "/logs", 403),
    ],
)
def test_a_non_resource_read_gets_one_answer_from_the_static_proxy_and_the_local_apiserver(
    token: str, path: str, want: int
) -> None:
    assert _proxy_answer(token, Attributes(verb="get", path=path)) == want
    assert _local_answer(token, "GET", path) == want


def test_a_non_resource_write_is_refused_by_both() -> None:
    assert _proxy_answer("t-none", Attributes(verb="post", path="/openapi/v2")) == 403
    assert _local_answer("t-none", "POST", "/openapi/v2") == 403


def test_a_repeated_metadata_field_merges_for_the_fence_as_for_the_decoder() -> None:
    # Two occurrences of field 1 (ObjectMeta): protobuf (and Go's proto.Unmarshal) merges them.
    owner = field(13, field(1, b"ReplicaSet") + field(3, b"rs") + field(4, b"rs-uid") + field(5, b"apps/v1"))
    first = field(1, field(1, b"web") + field(3, b"demo"))
    second = field(1, owner + field(11, field(1, b"app") + field(2, b"web")) + field(3, b"other"))
    data = body("v1", "Pod", first + field(2, b"") + second)
    fence = object_identity(data)["metadata"]
    decoded = decode_object(data)["metadata"]
    assert fence == {k: v for k, v in decoded.items() if v is not None}
    assert fence["name"] == "web" and fence["namespace"] == "other"  # the last scalar wins
    assert fence["labels"] == {"app": "web"}
    assert fence["ownerReferences"][0]["uid"] == "rs-uid"  # from the second occurrence

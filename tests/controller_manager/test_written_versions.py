"""The fenced API client records the resourceVersion of every successful write it makes of a shard resource.

Issue 46: a giver publishes the highest per resource (``handoverResourceVersions``)
so that its taker lists not older than them. A loopback HTTP server stands
in for the proxy; the official client's typed calls go through
:class:`controller_manager.fencing.FencedApiClient` as a controller's do:
the answer is read once for the version and still deserialized for the caller.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controller_manager.fencing import FencedApiClient, WriteFenced, api_client_for
from hashing import ShardBy
from rangeshard.core.ownertoken import OwnerToken


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        name = (body.get("metadata") or {}).get("name") or self.path.rstrip("/").rsplit("/", 1)[-1]
        if name == "conflict":
            code, doc = 409, {"kind": "Status", "code": 409, "reason": "Conflict", "message": "changed"}
        elif self.command == "DELETE":
            code, doc = 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
        else:
            rv = name.rsplit("-", 1)[-1] if "-" in name else "5"
            code, doc = (
                201,
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "resourceVersion": rv}},
            )
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_POST = do_PUT = do_PATCH = do_DELETE = _answer  # noqa: N815


@pytest.fixture
def api() -> Iterator[FencedApiClient]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="fake-proxy", daemon=True).start()
    client = api_client_for(f"http://127.0.0.1:{server.server_address[1]}")
    assert isinstance(client, FencedApiClient)
    client.set_rules({"configmaps": ShardBy.UID})
    client.set_token(OwnerToken("cm", "m-1", 0xABC, 4))
    yield client
    client.close()
    server.shutdown()
    server.server_close()


def test_successful_writes_of_shard_resources_are_recorded_and_still_answered(api: FencedApiClient) -> None:
    core = k8s.CoreV1Api(api)
    made = core.create_namespaced_config_map("a", {"metadata": {"name": "cm-71"}})
    assert made.metadata.resource_version == "71", "the caller still gets the object"
    core.replace_namespaced_config_map("cm-64", "a", {"metadata": {"name": "cm-64"}})  # lower: the highest stays
    core.delete_namespaced_config_map("cm-99", "a")  # a Status: no version
    with pytest.raises(ApiException) as conflict:  # an optimistic-concurrency conflict: not written
        core.replace_namespaced_config_map("conflict", "a", {"metadata": {"name": "conflict"}})
    assert conflict.value.status == 409 and not isinstance(conflict.value, WriteFenced)
    core.create_namespaced_secret("a", {"metadata": {"name": "s-88"}})  # not a shard resource: not recorded
    assert api.written.snapshot() == {"configmaps": 71}

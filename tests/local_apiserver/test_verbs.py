"""One handler per verb: the verb kube-apiserver derives for each method and target, and 405 where it refuses.

The HTTP behaviour of every verb is covered by the other tests of this
package; here the routing table itself: every derivable verb has exactly one
handler, and the refused combinations name what is not allowed.
"""

from __future__ import annotations

import pytest

from local_apiserver.errors import ApiError
from local_apiserver.handlers import VERBS, derive_verb
from local_apiserver.resources import ResourceTable
from local_apiserver.routing import Target
from rangeshard.core.listoptions import ListQuery


def _target(name: str | None, subresource: str = "") -> Target:
    spec = next(s for s in ResourceTable().specs() if s.resource == "pods")
    return Target(spec=spec, namespace="default", name=name, subresource=subresource, watch_path=False)


def _query(watch: bool) -> ListQuery:
    return ListQuery.parse({"watch": "true"} if watch else {}, watch_path=False)


@pytest.mark.parametrize(
    ("method", "name", "watch", "verb"),
    [
        ("GET", None, False, "list"),
        ("GET", None, True, "watch"),
        ("GET", "p", False, "get"),
        ("GET", "p", True, "watch"),
        ("POST", None, False, "create"),
        ("POST", "p", False, "create"),  # the create handler answers 405 (verb recorded first, as kube)
        ("PUT", "p", False, "update"),
        ("PATCH", "p", False, "patch"),
        ("DELETE", "p", False, "delete"),
        ("DELETE", None, False, "deletecollection"),
    ],
)
def test_each_method_and_target_has_one_verb_and_one_handler(
    method: str, name: str | None, watch: bool, verb: str
) -> None:
    query = _query(watch) if (method == "GET" and name is None) or watch else None
    assert derive_verb(method, _target(name), query) == verb
    assert verb in VERBS


@pytest.mark.parametrize(
    ("method", "name", "subresource", "watch", "message"),
    [
        ("POST", None, "", True, "watch is only allowed with GET"),
        ("GET", "p", "status", True, "watch is only allowed with GET"),
        ("PUT", None, "", False, "PUT is not allowed on a collection"),
        ("PATCH", None, "", False, "PATCH is not allowed on a collection"),
        ("OPTIONS", "p", "", False, "OPTIONS is not supported"),
    ],
)
def test_refused_combinations_are_405(
    method: str, name: str | None, subresource: str, watch: bool, message: str
) -> None:
    with pytest.raises(ApiError) as caught:
        derive_verb(method, _target(name, subresource), _query(watch) if watch else None)
    assert caught.value.code == 405
    assert message in caught.value.message


def test_the_table_has_exactly_the_kube_verbs() -> None:
    assert set(VERBS) == {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}

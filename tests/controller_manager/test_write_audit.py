"""The write-level audit check over API server audit events (python -m controller_manager.audit --apiserver-audit)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kubernetes import client as k8s

from controller_manager.audit import main
from controller_manager.fencing import FencedApiClient
from controller_manager.write_audit import check
from hashing import ShardBy
from rangeshard.core.ownertoken import SHARD_BY_HEADER, OwnerToken

A = OwnerToken("replicaset", "m1-replicaset", 0x10, 5)
A_LATER = OwnerToken("replicaset", "m1-replicaset", 0x10, 9)
B = OwnerToken("replicaset", "m2-replicaset", 0x20, 7)
D = OwnerToken("deployment", "m2-deployment", 0x21, 7)


def _event(token: OwnerToken | None, verb: str, resource: str, name: str, uid: str, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "RequestResponse",
        "auditID": f"id-{name}-{verb}",
        "stage": "ResponseComplete",
        "verb": verb,
        "userAgent": token.user_agent() if token else "kubectl/v1.32.0",
        "objectRef": {"resource": resource, "namespace": "ns", "name": name, "uid": uid, "apiGroup": ""},
        "responseStatus": {"code": extra.pop("code", 200)},
        "stageTimestamp": "2026-01-01T00:00:00.000000Z",
        **extra,
    }


def _pod(name: str, uid: str, owner_uid: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid, "ownerReferences": [{"uid": owner_uid, "controller": True}]}}


def test_a_token_writing_again_after_another_is_a_stale_owner(tmp_path: Path) -> None:
    events = [
        _event(A, "create", "pods", "p1", "p1", code=201, responseObject=_pod("p1", "p1", "rs-1")),
        _event(B, "create", "pods", "p2", "p2", code=201, responseObject=_pod("p2", "p2", "rs-1")),
        _event(A, "delete", "pods", "p1", "p1"),  # the DeleteOptions body names no owner: known from the create
    ]
    report = check(events)
    assert report.writes == 3 and len(report.stale) == 1
    stale = report.stale[0]
    assert stale.shard_key == "rs-1" and stale.write.token == A and stale.between.token == B
    log = tmp_path / "audit.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in events) + '{"kind": "Ev')  # a torn last line
    assert main(["--apiserver-audit", str(log)]) == 1


def test_handovers_failures_and_other_clients_are_not_stale(tmp_path: Path) -> None:
    events = [
        _event(A, "create", "pods", "p1", "p1", code=201, responseObject=_pod("p1", "p1", "rs-1")),
        _event(A_LATER, "update", "replicasets", "rs-1", "rs-1"),  # a new period of the same instance
        _event(B, "delete", "pods", "p1", "p1"),  # handed over to B
        _event(A, "create", "pods", "p3", "p3", code=409, requestObject=_pod("p3", "", "rs-1")),  # fenced: no write
        _event(None, "patch", "pods", "p2", "p2"),  # kubectl
        # The deployment type shards replicasets by their owner: a different type, a different key space.
        _event(D, "update", "replicasets", "rs-1", "rs-1", requestObject=_pod("rs-1", "rs-1", "dep-1")),
        _event(A, "update", "replicasets", "rs-2", "rs-2"),  # another key
    ]
    report = check(events)
    assert report.stale == []
    assert report.writes == 5
    log = tmp_path / "audit.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert main(["--apiserver-audit", str(log)]) == 0


def test_unreadable_file_exits_2(tmp_path: Path) -> None:
    assert main(["--apiserver-audit", str(tmp_path / "missing.jsonl")]) == 2
    assert main([]) == 2


def test_metadata_level_log_without_uids_is_checked_by_object() -> None:
    def bare(token: OwnerToken, verb: str, name: str) -> dict[str, Any]:
        ev = _event(token, verb, "widgets", name, "")
        del ev["objectRef"]["uid"]
        return ev

    report = check([bare(A, "update", "w1"), bare(B, "update", "w1"), bare(A, "delete", "w1")])
    assert len(report.stale) == 1 and report.stale[0].shard_key == "widgets/ns/w1"


def _declared(token: OwnerToken, rule: str) -> str:
    """The User-Agent the external endpoint sends: token, the client's agent, the declared rule."""
    return f"{token.user_agent()} client-go/v1.36.2 rangeshard-shard-by/{rule}"


RS_X = OwnerToken("kcm-rs", "m1-kcm-rs", 0x30, 3)
RS_Y = OwnerToken("kcm-rs", "m2-kcm-rs", 0x31, 3)


def _rs(name: str, uid: str, owner_uid: str, namespace: str = "ns") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "ownerReferences": [{"uid": owner_uid, "controller": True}],
        }
    }


def test_writes_are_keyed_by_the_rule_their_writer_declared() -> None:
    """Two ReplicaSets of one Deployment in two instances' ranges, written by uid: no stale owner.

    Keyed by the controller owner (the rule of a writer that declares none) the same writes are A, B, A on
    the Deployment's key: the false alarm the kube-controller-manager's replicaset controller would raise.
    """
    events = [
        _event(RS_X, "update", "replicasets", "r1", "r1", responseObject=_rs("r1", "r1", "d1")),
        _event(RS_Y, "update", "replicasets", "r2", "r2", responseObject=_rs("r2", "r2", "d1")),
        _event(RS_X, "update", "replicasets", "r1", "r1", responseObject=_rs("r1", "r1", "d1")),
    ]
    undeclared = check(events)
    assert [s.shard_key for s in undeclared.stale] == ["d1"]
    for e in events:
        token = OwnerToken.parse(str(e["userAgent"]))
        assert token is not None
        e["userAgent"] = _declared(token, "uid")
    declared = check(events)
    assert declared.stale == [] and declared.shard_keys == 2
    # By uid, a real stale owner is still found: X writes r1 again after Y took r1 over.
    stolen = [*events, _event(RS_Y, "update", "replicasets", "r1", "r1", responseObject=_rs("r1", "r1", "d1"))]
    stolen[-1]["userAgent"] = _declared(RS_Y, "uid")
    stolen.append({**events[0], "auditID": "again"})
    assert [s.shard_key for s in check(stolen).stale] == ["r1"]


def test_namespace_and_owner_rules_key_by_namespace_and_owner() -> None:
    cm = {"metadata": {"name": "c", "namespace": "team-a", "uid": "c1"}}
    events = [
        _event(RS_X, "create", "configmaps", "c", "c1", code=201, responseObject=cm),
        _event(
            RS_Y,
            "create",
            "configmaps",
            "d",
            "c2",
            code=201,
            responseObject={**cm, "metadata": {**cm["metadata"], "uid": "c2"}},
        ),
        _event(RS_X, "patch", "configmaps", "c", "c1", responseObject=cm),
    ]
    for e in events:
        e["objectRef"]["namespace"] = "team-a"
        token = OwnerToken.parse(str(e["userAgent"]))
        assert token is not None
        e["userAgent"] = _declared(token, "namespace")
    report = check(events)
    assert [s.shard_key for s in report.stale] == ["namespace/team-a"]  # one namespace, two writers: A, B, A
    pods = [
        _event(RS_X, "create", "pods", "p1", "p1", code=201, responseObject=_pod("p1", "p1", "rs-1")),
        _event(RS_X, "create", "pods", "p2", "p2", code=201, responseObject=_pod("p2", "p2", "rs-2")),
    ]
    for e in pods:
        e["userAgent"] = _declared(RS_X, "owner")
    assert check(pods).shard_keys == 2
    bogus = [{**pods[0], "userAgent": f"{RS_X.user_agent()} rangeshard-shard-by/label"}]
    assert check(bogus).shard_keys == 1  # an unknown rule is judged as undeclared, never a crash


def test_the_in_process_client_declares_its_rule_as_the_endpoint_does() -> None:
    """FencedApiClient's writes carry the rule in the User-Agent (relay.declare), so the audit needs no fallback."""
    client = FencedApiClient(k8s.Configuration(host="http://127.0.0.1:1"))
    client.set_token(A)
    client.set_rules({"replicasets.apps": ShardBy.UID, "pods": ShardBy.OWNER})
    sent: list[dict[str, str]] = []

    def request(method: str, url: str, headers: dict[str, str] | None = None, **_: Any) -> Any:
        sent.append(dict(headers or {}))
        return SimpleNamespace(status=200, data=b"{}", read=lambda: None)

    client.rest_client.request = request
    rss, pods, cms = "/apis/apps/v1/namespaces/ns/replicasets/r1", "/api/v1/namespaces/ns/pods/p1", "/api/v1/configmaps"
    for method, path in (("PATCH", rss), ("DELETE", pods), ("POST", cms), ("GET", rss)):
        client.call_api(method, f"http://127.0.0.1:1{path}", {"User-Agent": client.user_agent}, body={})
    agents = [headers["User-Agent"] for headers in sent]
    assert agents[0] == f"{A.user_agent()} rangeshard-shard-by/uid"
    assert agents[1] == f"{A.user_agent()} rangeshard-shard-by/owner"
    assert agents[2] == agents[3] == A.user_agent()  # not a sharded resource; a read
    assert [h.get(SHARD_BY_HEADER) for h in sent] == ["uid", "owner", None, None]
    # The audit keys the declared writes by the declared rule: the replicaset by its own uid, not its owner.
    rs = {"metadata": {"name": "r1", "uid": "r1", "ownerReferences": [{"uid": "d1", "controller": True}]}}
    events = [_event(A, "update", "replicasets", "r1", "r1", responseObject=rs)]
    events[0]["userAgent"] = agents[0]
    events += [{**events[0], "userAgent": f"{B.user_agent()} rangeshard-shard-by/uid"}, {**events[0]}]
    assert [s.shard_key for s in check(events).stale] == ["r1"]


def test_root_rule_keys_a_pod_by_the_top_of_its_owner_chain() -> None:
    """By ``root``, two pods of two ReplicaSets of one Deployment share the Deployment's key."""
    rs1 = {"metadata": {"name": "r1", "uid": "r1", "ownerReferences": [{"uid": "d1", "controller": True}]}}
    rs2 = {"metadata": {"name": "r2", "uid": "r2", "ownerReferences": [{"uid": "d1", "controller": True}]}}
    cycle = {"metadata": {"name": "c1", "uid": "c1", "ownerReferences": [{"uid": "c2", "controller": True}]}}
    cycle2 = {"metadata": {"name": "c2", "uid": "c2", "ownerReferences": [{"uid": "c1", "controller": True}]}}
    events = [
        _event(None, "create", "replicasets", "r1", "r1", code=201, responseObject=rs1),
        _event(None, "create", "replicasets", "r2", "r2", code=201, responseObject=rs2),
        _event(None, "create", "replicasets", "c1", "c1", code=201, responseObject=cycle),
        _event(None, "create", "replicasets", "c2", "c2", code=201, responseObject=cycle2),
        _event(RS_X, "update", "pods", "p1", "p1", responseObject=_pod("p1", "p1", "r1")),
        _event(RS_Y, "update", "pods", "p2", "p2", responseObject=_pod("p2", "p2", "r2")),
        _event(RS_X, "update", "pods", "p1", "p1", responseObject=_pod("p1", "p1", "r1")),
        _event(RS_X, "update", "pods", "p3", "p3", responseObject=_pod("p3", "p3", "c1")),
    ]
    writers = [RS_X, RS_Y, RS_X, RS_X]
    for e, token in zip(events[4:], writers, strict=True):
        e["userAgent"] = _declared(token, "root")
    report = check(events)
    # p1 and p2 are both under d1: X, Y, X on d1 is a stale owner; by owner they were two keys.
    assert [s.shard_key for s in report.stale] == ["d1"]
    assert report.shard_keys == 2  # d1, and the cycle c1 -> c2 -> c1 stops at a uid of the cycle
    for e, token in zip(events[4:], writers, strict=True):
        e["userAgent"] = _declared(token, "owner")
    assert check(events).stale == []


def test_root_writes_are_keyed_by_the_chain_at_their_place_in_the_log() -> None:
    """A ReplicaSet re-parented between writes of its pods: each write is keyed by the chain as the log has it then.

    The owner of the old Deployment wrote before the move, the new one's writes after it: no stale owner. A
    write of the old owner after the move (what a fence deciding on a lagging cache let through) is keyed by
    the new root: between two writes of the new root's owner, it makes the owner's next write the reported one.
    """
    x, y = OwnerToken("tree", "m1-tree", 0x40, 5217), OwnerToken("tree", "m2-tree", 0x41, 5212)
    moved = {"metadata": {"name": "r1", "uid": "r1", "ownerReferences": [{"uid": "e2", "controller": True}]}}
    events = [
        _event(None, "create", "replicasets", "r1", "r1", code=201, responseObject=_rs("r1", "r1", "e1")),
        _event(y, "patch", "deployments", "e2", "e2", responseObject={"metadata": {"name": "e2", "uid": "e2"}}),
        _event(x, "patch", "pods", "r1-0", "p0", responseObject=_pod("r1-0", "p0", "r1")),
        _event(x, "patch", "pods", "r1-2", "p2", responseObject=_pod("r1-2", "p2", "r1")),
        _event(None, "patch", "replicasets", "r1", "r1", responseObject=moved),
        _event(y, "patch", "pods", "r1-0", "p0", responseObject=_pod("r1-0", "p0", "r1")),
        _event(y, "patch", "deployments", "e2", "e2", responseObject={"metadata": {"name": "e2", "uid": "e2"}}),
    ]
    for e in events:
        token = OwnerToken.parse(str(e["userAgent"]))
        if token is not None:
            e["userAgent"] = _declared(token, "uid" if e["objectRef"]["resource"] == "deployments" else "root")
    assert check(events).stale == [] and check(events).shard_keys == 2  # e1 (before the move) and e2
    late = {**events[3], "auditID": "late"}  # x writes r1-2 again after the move, as if its view were older
    report = check([*events[:5], late, *events[5:]])
    assert [(s.shard_key, s.write.token, s.between.token) for s in report.stale] == [("e2", y, x)]


def test_a_root_write_is_keyed_by_the_chain_as_of_its_receipt() -> None:
    """A re-parenting the API server received after a write cannot have been seen by any fence: not that write's key.

    The fence decides before the write reaches the API server, so a chain change received after
    the write (though completed, and logged, before it) is concurrent with it: the write keeps
    the old root. A change received before the write keys it, even when it completes (and is
    logged) after it.
    """
    x, y = OwnerToken("tree", "m1-tree", 0x40, 5217), OwnerToken("tree", "m2-tree", 0x41, 5212)
    moved = {"metadata": {"name": "r1", "uid": "r1", "ownerReferences": [{"uid": "e2", "controller": True}]}}

    def at(e: dict[str, Any], received: str, done: str) -> dict[str, Any]:
        token = OwnerToken.parse(str(e["userAgent"]))
        if token is not None:
            e["userAgent"] = _declared(token, "uid" if e["objectRef"]["resource"] == "deployments" else "root")
        day = "2026-11-28T10:00:"
        return {**e, "requestReceivedTimestamp": f"{day}{received}Z", "stageTimestamp": f"{day}{done}Z"}

    def run(late_received: str, reparent_received: str, late_first: bool) -> list[tuple[str, OwnerToken]]:
        e2 = {"metadata": {"name": "e2", "uid": "e2"}}
        late = at(
            _event(x, "patch", "pods", "r1-2", "p2", responseObject=_pod("r1-2", "p2", "r1")),
            late_received,
            "03.020000",
        )
        reparent = at(
            _event(None, "patch", "replicasets", "r1", "r1", responseObject=moved), reparent_received, "03.010000"
        )
        events = [
            at(
                _event(None, "create", "replicasets", "r1", "r1", code=201, responseObject=_rs("r1", "r1", "e1")),
                "00.000000",
                "00.001000",
            ),
            at(_event(y, "patch", "deployments", "e2", "e2", responseObject=e2), "01.000000", "01.001000"),
            *([late, reparent] if late_first else [reparent, late]),
            at(
                _event(y, "patch", "pods", "r1-0", "p0", responseObject=_pod("r1-0", "p0", "r1")),
                "04.000000",
                "04.001000",
            ),
        ]
        return [(s.shard_key, s.write.token) for s in check(events).stale]

    assert run("03.000000", "03.005000", late_first=False) == []  # in flight when the move arrived: e1's
    assert run("03.006000", "03.005000", late_first=False) == [("e2", y)]  # sent after the move arrived
    assert run("03.006000", "03.005000", late_first=True) == [("e2", y)]  # the move completed last, arrived first
    assert run("03.000000", "03.005000", late_first=True) == []
    # Among the changes received before a write, the last committed counts (resourceVersion), not the last logged:
    # a status write of the old parent, committed before the re-parenting but logged after it, does not undo it.
    e2 = {"metadata": {"name": "e2", "uid": "e2"}}
    old = {"metadata": {**_rs("r1", "r1", "e1")["metadata"], "resourceVersion": "9"}}
    new = {"metadata": {**moved["metadata"], "resourceVersion": "10"}}
    created = {"metadata": {**_rs("r1", "r1", "e1")["metadata"], "resourceVersion": "8"}}
    events = [
        at(_event(None, "create", "replicasets", "r1", "r1", code=201, responseObject=created), "00.0", "00.1"),
        at(_event(y, "patch", "deployments", "e2", "e2", responseObject=e2), "01.0", "01.1"),
        at(_event(None, "patch", "replicasets", "r1", "r1", responseObject=new), "02.5", "02.7"),
        at(_event(None, "update", "replicasets", "r1", "r1", responseObject=old), "02.4", "02.8"),
        at(_event(x, "patch", "pods", "r1-2", "p2", responseObject=_pod("r1-2", "p2", "r1")), "03.0", "03.1"),
        at(_event(y, "patch", "pods", "r1-0", "p0", responseObject=_pod("r1-0", "p0", "r1")), "04.0", "04.1"),
    ]
    assert [(s.shard_key, s.write.token) for s in check(events).stale] == [("e2", y)]


def test_several_files_after_one_flag_and_rotated_logs_in_time_order(tmp_path: Path) -> None:
    """kube-apiserver rotates audit.log into audit-<timestamp>.log: all are read, oldest first, audit.log last."""
    events = [
        _event(A, "create", "pods", "p1", "p1", code=201, responseObject=_pod("p1", "p1", "rs-1")),
        _event(B, "create", "pods", "p2", "p2", code=201, responseObject=_pod("p2", "p2", "rs-1")),
        _event(A, "delete", "pods", "p1", "p1"),  # stale only if read after B's write
    ]
    logs = tmp_path / "logs"
    logs.mkdir()
    older = logs / "audit-2026-01-01T00-00-01.000.log"
    newer = logs / "audit-2026-01-01T00-00-02.000.log"
    current = logs / "audit.log"
    for path, event in zip((older, newer, current), events, strict=True):
        path.write_text(json.dumps(event) + "\n")
    (logs / "other-2026-01-01T00-00-03.000.log").write_text(json.dumps(events[0]) + "\n")  # not audit.log's

    assert main(["--apiserver-audit", str(current)]) == 1, "the rotated files are read before audit.log"
    assert main(["--apiserver-audit", str(current), str(newer), str(older)]) == 1, "given out of order: sorted"
    assert main(["--apiserver-audit", str(newer)]) == 0, "a rotated file named alone: no siblings"
    assert check(list(reversed(events))).stale == [], "the order matters: read newest first, nothing is stale"
    from controller_manager.write_audit import audit_files  # noqa: PLC0415

    assert audit_files([current]) == [older.resolve(), newer.resolve(), current.resolve()]
    # Reconcile FILEs go before the flag; the flag still takes several files.
    reconcile = tmp_path / "reconcile.jsonl"
    reconcile.write_text("")
    assert main([str(reconcile), "--apiserver-audit", str(older), str(newer), str(current)]) == 1


def test_by_label_writes_are_keyed_by_the_label_value() -> None:
    """``rangeshard-shard-by/label rangeshard-shard-label/<key>``: one key per value; without the label, the uid."""
    from hashing import ShardBy  # noqa: PLC0415
    from rangeshard.core.ownertoken import shard_by_agent  # noqa: PLC0415

    def labelled(token: OwnerToken, verb: str, name: str, tenant: str | None) -> dict[str, Any]:
        obj = {"metadata": {"name": name, "uid": name, "labels": {"example.com/tenant": tenant} if tenant else {}}}
        ev = _event(token, verb, "configmaps", name, name, responseObject=obj)
        ev["userAgent"] = f"{token.user_agent()} {shard_by_agent(ShardBy.LABEL, 'example.com/tenant')}"
        return ev

    moved = [
        labelled(A, "update", "c1", "acme"),
        labelled(B, "update", "c2", "acme"),  # the value moved to B
        labelled(A, "update", "c3", "acme"),  # A writes the value again: stale, though c3 is another object
    ]
    report = check(moved)
    assert [s.shard_key for s in report.stale] == ["label/example.com/tenant=acme"]
    apart = [
        labelled(A, "update", "c1", "acme"),
        labelled(B, "update", "c2", "globex"),
        labelled(A, "update", "c3", "acme"),
        labelled(B, "update", "c4", None),  # no label: keyed by its uid
        labelled(A, "update", "c5", None),
    ]
    assert check(apart).stale == []

"""The relay rules: what a hop of ours passes on, sans I/O (the proxy's pass-through, the external endpoint).

Purpose
    Two relays forward a client's request to the next hop and its answer
    back: the range filter proxy's pass-through (to the kube-apiserver) and a
    manager's external endpoint (to the proxy). Each keeps only its sockets;
    the rules of what passes are here, as pure functions over header lists
    (``(name, value)`` pairs, names in any case):

    * :func:`request_headers` - hop-by-hop headers dropped, protobuf taken
      out of ``Accept`` (:func:`json_accept`: both hops answer JSON), the
      client's ``Authorization`` kept, dropped or replaced by the relay's own;
    * :func:`response_headers` - hop-by-hop headers dropped (and the length,
      when the relay frames the body itself);
    * :func:`has_body` - whether a request carries a body to forward;
    * the shard-rule declaration: :func:`write_rule` says which writes carry
      the owner token (a write to a resource the instance shards),
      :func:`declare` puts the token and the rule on such a write,
      :func:`declared_rule` reads the rule a write declares (the proxy's
      write fence).

Invariants
    * Hop-by-hop headers (RFC 9110, and ``Host``) never pass either way.
    * A declared write's User-Agent is the owner token, then the client's
      own agent, then ``rangeshard-shard-by/<rule>``; its
      ``X-Rangeshard-Shard-By`` header names the same rule
      (:mod:`rangeshard.core.ownertoken` spells both).
    * A header with a line break is refused, never sent, and its value never
      echoed (it may be a bearer token).

Concurrency model
    Pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hashing import ShardBy
from rangeshard.core.ownertoken import (
    SHARD_BY_HEADER,
    SHARD_LABEL_HEADER,
    OwnerToken,
    declared_shard_by,
    declared_shard_label,
    shard_by_agent,
)
from rangeshard.core.requestinfo import RequestInfo, is_write

Headers = Iterable[tuple[str, str]]

#: Headers a relay never forwards (RFC 9110 hop-by-hop, and ``host``), lower case.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
_SHARD_BY = SHARD_BY_HEADER.lower()
_SHARD_LABEL = SHARD_LABEL_HEADER.lower()


def json_accept(value: str) -> str:
    """Protobuf out of an ``Accept`` header (a relay answering JSON only): client-go sends both and takes JSON."""
    kept = [p for p in value.split(",") if "protobuf" not in p]
    return ",".join(kept).strip() or "application/json"


def request_headers(
    headers: Headers, *, client_authorization: bool = True, authorization: str | None = None, identity: bool = False
) -> list[tuple[str, str]]:
    """The headers of a request as the relay forwards it.

    The client's ``Authorization`` passes when ``client_authorization`` is
    true and the relay has no ``authorization`` of its own, which replaces
    it. ``identity``: the relay reads the answer, so it asks for no
    compression (``Accept-Encoding`` dropped).
    """
    out: list[tuple[str, str]] = []
    for key, value in headers:
        k = key.lower()
        if k in HOP_BY_HOP or (identity and k == "accept-encoding"):
            continue
        if k == "authorization" and (authorization is not None or not client_authorization):
            continue
        out.append((key, json_accept(value) if k == "accept" else value))
    if authorization is not None:
        out.append(("Authorization", authorization))
    return out


def response_headers(headers: Headers, *, framed: bool = False) -> list[tuple[str, str]]:
    """The headers of an answer as the relay returns it; ``framed``: the relay sets the length itself."""
    return [
        (k, v) for k, v in headers if k.lower() not in HOP_BY_HOP and not (framed and k.lower() == "content-length")
    ]


def has_body(method: str, headers: Mapping[str, str]) -> bool:
    """Whether a request has a body to forward: every write, and any request that announces one.

    ``headers`` is keyed by lower case names.
    """
    return is_write(method) or "content-length" in headers or "transfer-encoding" in headers


def write_rule(rules: Mapping[str, ShardBy], info: RequestInfo) -> ShardBy | None:
    """The rule a write declares: writes (any subresource) to a resource in ``rules`` (by ``resource.group``)."""
    if not info.is_write or info.resource is None:
        return None
    return rules.get(info.resource.label)


def declare(headers: Headers, token: OwnerToken, rule: ShardBy, label: str | None = None) -> list[tuple[str, str]]:
    """``headers`` of a write by ``token`` under ``rule``: the token first in the User-Agent, the rule declared.

    ``label``: the label key of a ``by: label`` rule (declared too).
    """
    agent = ""
    out: list[tuple[str, str]] = []
    for key, value in headers:
        k = key.lower()
        if k == "user-agent":
            agent = agent or value
        elif k not in (_SHARD_BY, _SHARD_LABEL):
            out.append((key, value))
    # The owner token, the client's own agent, then the rule again for the audit log (which records no header).
    out.append(("User-Agent", " ".join(filter(None, (token.user_agent(), agent, shard_by_agent(rule, label))))))
    out.append((SHARD_BY_HEADER, rule.value))
    if rule is ShardBy.LABEL and label:
        out.append((SHARD_LABEL_HEADER, label))
    return out


def declared_rule(headers: Mapping[str, str]) -> ShardBy | None:
    """The rule a write declares (header, else User-Agent product token); ``ValueError`` names the rules.

    ``headers`` is keyed by lower case names.
    """
    return declared_shard_by(headers.get(_SHARD_BY), headers.get("user-agent"))


def declared_label(headers: Mapping[str, str]) -> str | None:
    """The label key a write declares (header, else User-Agent product token); ``ValueError`` for a bad one.

    ``headers`` is keyed by lower case names.
    """
    return declared_shard_label(headers.get(_SHARD_LABEL), headers.get("user-agent"))

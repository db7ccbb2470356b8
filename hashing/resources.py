"""The one parser of resource names as kubectl spells them: ``pods``, ``replicasets.apps``, ``deployments.v1.apps``.

Purpose
    Every component that reads a resource name from a user (the proxy's
    ``--resources``, the manager's ``external.shard[].resource`` and
    ``.via``, the ``root`` rule's selector path, ``rangeshard deploy``) reads
    it here, so one name means one resource everywhere. As in kubectl
    (``schema.ParseResourceArg``): ``resource.version.group`` when the second
    part is a Kubernetes version (``v1``, ``v2beta1``) and a group follows,
    else ``resource.group``; so ``pods.v1`` is ``pods`` of the group ``v1``
    (kubectl's core-group spelling is ``pods`` or ``pods.v1.``, which is no
    name here).

Invariants
    * A name is lowercase DNS labels joined by dots; anything else is a
      ``ValueError`` naming it.
    * ``resource_label(n)`` is ``resource.group`` (``resource`` for the core
      group): the version never changes which resource a name means.

Concurrency model
    Pure functions.
"""

from __future__ import annotations

import re

_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_VERSION_RE = re.compile(r"v[0-9]+((alpha|beta)[0-9]+)?")


def parse_resource_name(spec: str) -> tuple[str, str | None, str]:
    """``(resource, version or None, group)`` of a kubectl-style name; the core group is ``""``.

    ``ValueError`` for an empty name or one that is not lowercase DNS labels joined by dots.
    """
    text = spec.strip() if isinstance(spec, str) else ""
    if not text:
        raise ValueError("empty resource name")
    if not _NAME_RE.fullmatch(text):
        raise ValueError(f"{text!r} is not a resource name like pods, replicasets.apps or deployments.v1.apps")
    resource, _, rest = text.partition(".")
    version, dot, group = rest.partition(".")
    if dot and _VERSION_RE.fullmatch(version):
        return resource, version, group
    return resource, None, rest


def resource_label(spec: str) -> str:
    """``resource.group`` (``resource`` for the core group) of a kubectl-style name, the version dropped."""
    resource, _version, group = parse_resource_name(spec)
    return f"{resource}.{group}" if group else resource

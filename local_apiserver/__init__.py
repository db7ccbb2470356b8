"""A small Kubernetes-compatible API server that stores objects in etcd.

Purpose
    A test bed and demo upstream for rangeshard (a real kube-apiserver cannot
    be installed from the package registries). It serves discovery, CRUD,
    list/watch with ``resourceVersion`` taken from etcd revisions, label and
    field selectors, optimistic concurrency, the ``status`` and ``scale``
    subresources and background cascading deletion for a fixed table of
    resources (:mod:`local_apiserver.resources`). What it does not implement
    answers a Kubernetes ``Status`` (404/405/415), never a wrong success.
    See ``docs/local_apiserver.md``.

Modules
    ``resources`` (the resource table), ``errors`` (``ApiError`` and ``Status``
    bodies), ``selectors`` (label/field selectors), ``validation``,
    ``patch`` (merge and JSON patch), ``strategic`` (strategic merge patch),
    ``store`` (the etcd storage, synchronous), ``watch`` (etcd watch -> asyncio bridge), ``gc`` (cascading deletion),
    ``auth`` (``--token-file``, the fixed policy, TokenReview and
    SubjectAccessReview), ``middleware`` (body limit, authentication),
    ``app`` (FastAPI routes, ``create_app``), ``process``
    (``LocalApiServerProcess``), ``cli`` (``local_apiserver_command``).

Invariants
    Imports only ``registry``, ``hashing`` and ``rangeshard.core.errors`` of ours
    (import-linter contract).

Concurrency model
    See each module; the HTTP layer is asyncio, etcd calls run in threads.
"""

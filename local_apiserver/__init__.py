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
    bodies), ``validation``, ``defaults`` (kube's server-side defaults of
    built-in kinds), ``patch`` (merge and JSON patch), ``strategic``
    (strategic merge patch), ``store`` (the etcd storage, synchronous),
    ``codec`` (its stored form, resource versions, continue tokens),
    ``strategy`` (what an update stores, preconditions, pod grace periods),
    ``watch`` (etcd watch -> asyncio bridge), ``gc`` (cascading deletion),
    ``auth`` (``--token-file``, the fixed policy, TokenReview and
    SubjectAccessReview), ``rbac`` (``--authorization-mode RBAC``: Roles and
    bindings evaluated as kube does, bootstrap ClusterRoles),
    ``serviceaccounts`` (TokenRequest, ServiceAccount tokens),
    ``middleware`` (body limit, authentication),
    ``app`` (``create_app``: the application, health, discovery roots),
    ``routing`` (paths, discovery documents, query parameters, bodies),
    ``handlers`` (one handler per verb), ``scale`` (the Scale subresource),
    ``state`` (what routes share, response helpers), ``process``
    (``LocalApiServerProcess``), ``cli``
    (``local_apiserver_command``), ``audit`` (the ``audit.k8s.io/v1`` audit
    log), ``conversion`` (API form <-> stored form), ``crd``
    (CustomResourceDefinitions), ``schema`` (OpenAPI v3 validation and
    defaulting of custom resources), ``fieldvalidation``
    (``fieldValidation=Strict|Warn|Ignore``), ``openapi`` (``/openapi/v2`` and
    ``/openapi/v3``), ``tables`` (Table answers), ``services`` (cluster IPs and
    node ports), ``kubelet`` (the simulated node). Label/field selectors come from
    :mod:`rangeshard.core.selectors`.

May import
    ``rangeshard.core`` (foundation: errors, the etcd client, child
    processes, Kubernetes API helpers, selectors) and ``hashing``. Never
    ``registry`` (it stores Kubernetes objects, not instances), the proxy,
    the controller manager or the CLI (import-linter contracts).

Concurrency model
    See each module; the HTTP layer is asyncio, etcd calls run in threads.
"""

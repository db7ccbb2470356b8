"""External controllers: shard any controller, unmodified, through a local endpoint of its manager.

Purpose
    A controller entry with ``external:`` runs no ``Controller`` class. The
    manager registers one instance for it as usual and serves an HTTP
    endpoint the controller's kubeconfig points at. The endpoint forwards
    every request to the range filter proxy and

    * adds ``shardSelector=shardRange(<path>, ...)`` for the instance's
      current range to every list and watch of a resource named in
      ``shard`` (a selector sent by the client itself is a 400);
    * puts the instance's owner token at the start of the User-Agent of
      every write to such a resource, followed by the client's own
      User-Agent and ``rangeshard-shard-by/<rule>``, and declares the rule
      in ``X-Rangeshard-Shard-By`` (the proxy's write fencing then protects
      it);
    * turns a range change into watch resets: every open watch of a
      ``shard`` resource ends with an ``ERROR`` event carrying a ``410
      Expired`` Status, which every client library answers with a relist;
      a watch may resume only from a resourceVersion handed out since.

    With ``command`` the manager also runs (and probes, and restarts) the
    controller. Modules, one concept each:

    * :mod:`controller_manager.external.runtime` - ``ExternalRuntime``: the
      shard instance, endpoint and child of one controller type, wired; the
      handover as the endpoint sees it; leaving while the child is down
    * :mod:`controller_manager.external.serving` - ``ServingState``: serving
      periods, issued resourceVersions, open watches and their cut, writes
      in flight (the drain)
    * :mod:`controller_manager.external.endpoint` - ``Endpoint``: what each
      request becomes on its way to the proxy
    * :mod:`controller_manager.external.child` - ``Child``: the controller's
      process, its restarts and its liveness probe
    * :mod:`controller_manager.external.workload` - ``MainObjects``: the
      main resource's objects the endpoint served, as the instance's
      published workload (so ``rebalance --by workload`` sees external types)

May import
    What :mod:`controller_manager` may (never the proxy: it talks to it over
    HTTP). Nothing of the official Kubernetes client or of the in-process
    controller framework: an external-only manager does not load them.

Concurrency model
    Threads, like the rest of the manager (the shard instance's, the child's
    supervisor and prober, the membership supervisor), plus one event loop
    thread for the endpoint; see each module.
"""

from __future__ import annotations

from controller_manager.external.child import Child, expand
from controller_manager.external.endpoint import Endpoint
from controller_manager.external.runtime import ExternalRuntime

__all__ = ["Child", "Endpoint", "ExternalRuntime", "expand"]

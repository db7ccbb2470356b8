"""Controller manager: config-file managers running sharded controllers with an enforced handover.

Purpose
    ``rangeshard controller-manager --config FILE`` runs every controller the
    file lists (Arktos proposal C); each controller type in each process is
    one registered instance owning a hash range. Modules:

    * :mod:`controller_manager.config` - the YAML config (pydantic, exit 2 on errors), a package:
      section models, the external entry, loading, the Markdown reference
    * :mod:`controller_manager.sharding` - registry membership and the
      init/locked/wait/active state machine (the safety rules live here):
      the I/O of :mod:`controller_manager.handover`, the decisions without
      I/O (states, transitions, ``decide(view) -> actions``, the order in
      which a controller's caches see a range change); its settings and
      runtime interface in :mod:`controller_manager.shardhost`
    * :mod:`controller_manager.controller` - the framework: informers, workqueue,
      workers, in-range check, audit; what one reconcile is given
      (deadline, expectations, requeue) in :mod:`controller_manager.reconcile`
    * :mod:`controller_manager.informer` (the thread driver of the foundation's
      reflector, :mod:`rangeshard.core.reflector`), its indexed store
      :mod:`controller_manager.indexer` (client-go's ``Indexer``: by namespace,
      controller owner, orphans, and a controller's own), :mod:`controller_manager.workqueue`
    * :mod:`controller_manager.controllers` - ReplicaSet and Deployment
    * :mod:`controller_manager.audit` - the reconcile audit log and overlap checker
    * :mod:`controller_manager.write_audit` - the write-level check over an
      API server's audit log (no stale-owner write)
    * :mod:`controller_manager.fencing` - owner tokens and shard hashes on
      requests; a fenced answer is lost ownership
    * :mod:`controller_manager.freshness` - lists after a range change not
      older than the giver's last writes (published ``handoverResourceVersions``),
      served from the proxy's cache
    * :mod:`controller_manager.cost` - measured reconcile cost per key hash
      (``rebalance --by cost``)
    * :mod:`controller_manager.metrics` - Prometheus metrics and their endpoint
    * :mod:`controller_manager.plugins` - which class runs a configured controller
    * :mod:`controller_manager.resources` - the resources a controller watches
    * :mod:`controller_manager.manager` - the process
    * :mod:`controller_manager.external` - external controllers (a package:
      runtime, serving state, endpoint, its sockets, child process): the
      endpoint that shards an unmodified controller, and its child process
    * :mod:`controller_manager.probes` - liveness probes of external children
      (kubelet's ``httpGet``/``exec`` semantics)
    * :mod:`controller_manager.watchdog` - stuck built-in controllers: not
      ready, then leave and exit for the supervisor to restart the manager
    * :mod:`controller_manager.process` - ``ManagerProcess``, the one launcher
      and wrapper of manager child processes (``up``, the test kit, tests,
      benchmarks)

May import
    ``registry``, ``rangeshard.core`` (foundation) and ``hashing``. Never the
    proxy or the local API server (it talks to the proxy over HTTP), nor the
    CLI (import-linter contracts).

Concurrency model
    Threads, like client-go: informer threads, N workers per controller, a
    state-machine thread per instance, lease keeper and membership watch
    threads. This package imports nothing at import time (so
    ``python -m controller_manager.audit`` stays clean).
"""

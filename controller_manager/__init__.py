"""Controller manager: config-file managers running sharded controllers with an enforced handover.

Purpose
    ``rangeshard controller-manager --config FILE`` runs every controller the
    file lists (Arktos proposal C); each controller type in each process is
    one registered instance owning a hash range. Modules:

    * :mod:`controller_manager.config` - the YAML config (pydantic, exit 2 on errors)
    * :mod:`controller_manager.sharding` - registry membership and the
      init/locked/wait/active state machine (the safety rules live here)
    * :mod:`controller_manager.controller` - the framework: informers, workqueue,
      workers, in-range check, audit
    * :mod:`controller_manager.informer`, :mod:`controller_manager.workqueue`
    * :mod:`controller_manager.controllers` - ReplicaSet and Deployment
    * :mod:`controller_manager.audit` - the reconcile audit log and overlap checker
    * :mod:`controller_manager.manager` - the process

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

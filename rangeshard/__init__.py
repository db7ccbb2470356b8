"""rangeshard: many instances of one Kubernetes controller, each owning a slice of a hash space.

This package holds two floors of the house (see ``docs/architecture.md``):

* the **top floor**: the command-line interface (:mod:`rangeshard.cli`) and
  the dashboard (:mod:`rangeshard.dashboard`), which may import everything;
* the **foundation** (:mod:`rangeshard.core`): errors, the etcd client,
  child processes, Kubernetes API helpers and the selector parser, which
  imports nothing above it.

Also here: :mod:`rangeshard.testing`, a test kit for your own sharded
controllers (top floor, beside the CLI), and, one floor below them,
:mod:`rangeshard.localcluster`: the one way to run etcd, the local API
server, the proxy and N controller managers as child processes (``up``,
the test kit and the benchmarks all use it).

The components live in the top-level packages ``hashing``, ``registry``,
``range_filter_proxy``, ``controller_manager`` and ``local_apiserver``.
"""

__version__ = "0.1.0"

"""rangeshard: many instances of one Kubernetes controller, each owning a slice of a hash space.

This package holds the command-line interface (:mod:`rangeshard.cli`) and the
project's error tree (:mod:`rangeshard.errors`). The components live in the
top-level packages ``hashing``, ``registry``, ``range_filter_proxy``,
``controller_manager`` and ``local_apiserver``; see ``docs/architecture.md``.
"""

__version__ = "0.1.0"

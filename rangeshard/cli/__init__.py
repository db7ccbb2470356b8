"""The ``rangeshard`` command line; see :mod:`rangeshard.cli.main`.

Owns
    The top floor: the Typer application and its sub-commands (``up``,
    ``registry``, ``rebalance``, ``hash``, and the component commands
    ``proxy``, ``controller-manager``, ``local-apiserver``), logging
    configuration, and the mapping of the error tree to exit codes.

May import
    Everything: the components, ``registry``, ``rangeshard.core``,
    ``hashing`` and the dashboard. Nothing imports it (import-linter).
"""

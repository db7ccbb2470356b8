"""The ``rangeshard`` command line; see :mod:`rangeshard.cli.main`.

Owns
    The top floor: the Typer application and its sub-commands (``up``,
    ``registry``, ``rebalance``, ``hash``, and the component commands
    ``proxy``, ``controller-manager``, ``local-apiserver``), logging
    configuration, and the mapping of the error tree to exit codes.

Modules
    ``main`` (the application, logging, exit codes), ``components`` (the
    component servers as subcommands), ``manager`` (``rangeshard
    controller-manager``, registered alone when asked for), ``up`` and ``updown`` (``rangeshard
    up``: port plan, readiness, demo), ``state`` (``status`` / ``down``),
    ``statefile`` (the state directory's records: ``up.json``, hand-started
    managers, the etcd and proxy recorded there), ``registry_cmds`` (``rangeshard registry``),
    ``rebalance_cmds`` (``rangeshard rebalance``), ``deploy_cmds``
    (``rangeshard deploy rbac``: the proxy's read RBAC of a manager config), ``progress`` (each
    instance's unanswered changes as the proxy measures them: stuck instances), ``common`` (shared
    etcd options, errors, stop signal), ``tables`` (how tables are printed).

May import
    Everything: the components, ``registry``, ``rangeshard.core``,
    ``hashing`` and the dashboard. Nothing imports it (import-linter).

Invariants
    * httpx's own command line (``httpx._main``: rich, pygments, click,
      about 4 MiB once imported) is never loaded by a process that entered
      here: httpx imports it whenever those packages are installed, as they
      are with Typer, and nothing of ours runs it.
"""

from __future__ import annotations

import sys

sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # see Invariants

"""``python -m local_apiserver --etcd URL --port P``: run the local API server.

Purpose
    Standalone entry point (used by :class:`local_apiserver.process.LocalApiServerProcess`).

Invariants
    Same options and exit codes as ``rangeshard local-apiserver``.

Concurrency model
    Runs uvicorn in the main thread until SIGINT/SIGTERM.
"""

from rangeshard.core.entrypoint import reexec_if_shadowed

# Before our imports: from a directory shadowing our packages they break (rangeshard.core.entrypoint).
reexec_if_shadowed("local_apiserver")

from local_apiserver.cli import main  # noqa: E402
from rangeshard.core import help_format  # noqa: E402

if __name__ == "__main__":
    help_format.install()
    main()

"""``python -m local_apiserver --etcd URL --port P``: run the local API server.

Purpose
    Standalone entry point (used by :class:`local_apiserver.process.LocalApiServerProcess`).

Invariants
    Same options and exit codes as ``rangeshard local-apiserver``.

Concurrency model
    Runs uvicorn in the main thread until SIGINT/SIGTERM.
"""

from local_apiserver.cli import main
from rangeshard.core import help_format

if __name__ == "__main__":
    help_format.install()
    main()

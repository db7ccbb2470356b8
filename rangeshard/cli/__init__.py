"""The ``rangeshard`` command line; see :mod:`rangeshard.cli.main`."""

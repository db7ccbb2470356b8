"""pytest fixtures of the rangeshard test kit (:mod:`rangeshard.testing`).

Purpose
    Installed with rangeshard as the ``pytest11`` entry point ``rangeshard``,
    so the fixtures are available in any project that has rangeshard
    installed (or add ``pytest_plugins = ["rangeshard.testing.pytest_plugin"]``
    to a ``conftest.py``):

    * ``rangeshard_cluster`` (session): etcd + local API server + proxy,
      started once per test session (:class:`~rangeshard.testing.TestCluster`);
    * ``rangeshard_namespace``: a fresh namespace for one test, deleted after it;
    * ``rangeshard_managers``: a factory ``start(controller, n=1, workers=2)``
      that starts N manager processes running your controller class with
      audit logs and returns a :class:`~rangeshard.testing.Managers` (all are
      stopped after the test);
    * ``rangeshard_crds`` (option ``--rangeshard-crd FILE``, repeatable, or
      the ini option ``rangeshard_crds``): CRD manifests installed once on the
      session cluster.

Invariants
    Importing this module starts nothing and imports nothing heavy: the kit is
    imported when a fixture is first used, so the plugin costs nothing in
    test sessions that do not use it.

Concurrency model
    pytest's: fixtures run on the test's thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from rangeshard.testing import Managers, TestCluster


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rangeshard", "rangeshard test kit")
    group.addoption(
        "--rangeshard-crd",
        action="append",
        default=[],
        metavar="FILE",
        help="CRD manifest to install on the rangeshard_cluster (repeatable).",
    )
    parser.addini("rangeshard_crds", "CRD manifests to install on the rangeshard_cluster", type="paths", default=[])


@pytest.fixture(scope="session")
def rangeshard_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestCluster]:
    """etcd, the local API server and the range filter proxy, once per session."""
    from rangeshard.testing import TestCluster  # noqa: PLC0415 (heavy: only when used)

    cluster = TestCluster(tmp_path_factory.mktemp("rangeshard"))
    cluster.start()
    try:
        crds: list[Any] = [*request.config.getini("rangeshard_crds"), *request.config.getoption("rangeshard_crd")]
        for crd in crds:
            cluster.apply(Path(crd))
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def rangeshard_namespace(rangeshard_cluster: TestCluster) -> Iterator[str]:
    """A fresh namespace for this test (deleted afterwards, with everything in it)."""
    name = rangeshard_cluster.create_namespace()
    yield name
    rangeshard_cluster.delete_namespace(name)


@pytest.fixture
def rangeshard_managers(rangeshard_cluster: TestCluster) -> Iterator[Callable[..., Managers]]:
    """``start(controller, n=1, workers=2, ...)`` -> running :class:`~rangeshard.testing.Managers`."""
    started: list[Managers] = []

    def start(controller: Any, n: int = 1, **kwargs: Any) -> Managers:
        group = rangeshard_cluster.start_managers(controller, n, **kwargs)
        started.append(group)
        return group

    yield start
    for group in started:
        group.stop()
        if group in rangeshard_cluster.groups:
            rangeshard_cluster.groups.remove(group)

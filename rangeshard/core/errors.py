"""The one error tree of rangeshard.

Purpose
    Every error our code raises on purpose is a subclass of
    :class:`RangeshardError`, so callers (the CLI above all) can tell expected
    failures (print a message, exit 2 or 1) from bugs (traceback). Foreign
    errors (gRPC, etcd, HTTP, pydantic) are translated at the edge with
    ``raise ... from e`` and never leak past the package that talks to them.

The tree::

    RangeshardError
    ├── ConfigError                 bad configuration or CLI input (exit 2)
    ├── EtcdServerError             the embedded etcd server cannot start / stop
    ├── PortInUseError              (rangeshard.core.ports) a port ``up`` needs is taken (exit 1)
    ├── NotReadyError               (rangeshard.cli.updown) a component ``up`` started died or stayed unhealthy
    ├── UpRunningError              (rangeshard.cli.up) an ``up`` recorded in the state dir is still running
    ├── LocalClusterError           (rangeshard.localcluster) a part of the local cluster asked for before start
    ├── TestKitError                (rangeshard.testing) a part of the test cluster did not start, a wait timed out
    ├── ManagerProcessError         (controller_manager.process) a controller-manager child did not start
    ├── ControllerError             raised inside the controller framework
    │   ├── ReconcileTimeout        a reconcile reached its deadline (fencing or its own bound)
    │   ├── Requeue                 (controller_manager.controller) reconcile again later
    │   └── WriteFenced             (controller_manager.fencing) the proxy refused a write: ownership is lost
    ├── ClientGone                  (rangeshard.core.kubeapi) the client left before its request body was read
    ├── ApiError                    (rangeshard.core.kubeapi) an HTTP failure answered as a Kubernetes Status
    │   ├── RequestTooLarge         a request body over the limit (413)
    │   └── SelectorParseError      (rangeshard.core.selectors) a label/field selector that cannot be parsed (400)
    ├── UpstreamError               an upstream HTTP server (the API server behind the proxy, the proxy behind
    │   │                           the external endpoint) answered with an error (``code``, ``status`` kept)
    │   ├── UpstreamUnavailable     the upstream could not be reached
    │   └── UpstreamGone            410: relist
    ├── ProxyError                  (range_filter_proxy.errors) the range filter proxy
    │   └── ProxyProcessError       (range_filter_proxy.process) the proxy child did not start
    ├── LocalApiServerError         (local_apiserver.process) the API server child did not start
    ├── ProtobufError               (rangeshard.core.protobuf_wire) a body that is not well-formed Kubernetes protobuf
    │   └── UnsupportedProtobuf     (rangeshard.core.protobuf_decode) a kind or field the decoder's table lacks (415)
    ├── ReflectorError              (rangeshard.core.reflector) a list of more pages than the bound
    ├── PeerError                   (rangeshard.core.http1client) an HTTP/1.1 peer failed a request of ours
    │   ├── Unreachable             no connection, or it closed before any byte of the request left
    │   ├── AnswerLost              the request left, its answer's head never came: a write may have been applied
    │   ├── BodyBroken              the answer's body was cut, malformed, idle too long or not read on
    │   └── LineTooLong             a line of a streamed body (a watch event) longer than the limit
    ├── PlanError                   (registry.rebalance) no rebalance plan can be made: nothing measured (exit 2)
    └── RegistryError               anything etcd reports (mapped once, in rangeshard.core.etcd.errors)
        ├── RegistryUnavailable     etcd unreachable or too slow (retry later)
        ├── EtcdAuthFailed          etcd refused the credentials or the permission
        ├── EtcdRequestTooLarge     a request over etcd's or gRPC's size limit
        ├── FutureRevision          a read at a revision etcd has not reached yet
        ├── RevisionCompacted       a read at a compacted revision (relist)
        │   └── WatchCompacted      a watch's start revision was compacted (relist)
        ├── CompareFailed           a guarded transaction lost a race
        ├── NotRegistered           the instance record does not exist (any more)
        ├── AlreadyRegistered       the instance id is already in the registry
        ├── LeaseLost               the instance's lease expired or was revoked
        └── NoSplittableRange       every range holds a single key

    hashing.SelectorSyntaxError (a ValueError) stays outside: ``hashing`` is
    pure and imports nothing of ours; HTTP layers translate it to 400.

Invariants
    This module imports nothing of ours (import-linter contract), so every
    package can depend on it.

Concurrency model
    Plain exception classes, no state.
"""

from __future__ import annotations

from typing import Any


class RangeshardError(Exception):
    """Base of every error rangeshard raises on purpose."""


class ConfigError(RangeshardError):
    """Invalid configuration or command-line input; ``problems`` lists ``field: problem`` lines."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or [message]


class PortInUseError(RangeshardError):
    """Ports needed by a command are taken; ``problems`` names each port and its holder."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or [message]


class EtcdServerError(RangeshardError):
    """The embedded etcd server could not be found, started or stopped."""


class ControllerError(RangeshardError):
    """An error of the controller framework."""


class ReconcileTimeout(ControllerError):
    """A reconcile ran out of time: its own bound or the lease's fencing deadline."""


class PlanError(RangeshardError):
    """The rebalance planner cannot make a plan (no reconcile times, too little histogram resolution)."""


class RegistryError(RangeshardError):
    """An error reported by the etcd registry."""


class RegistryUnavailable(RegistryError):
    """etcd could not be reached (or did not answer in time)."""


class EtcdAuthFailed(RegistryError):
    """etcd refused the user name and password, or the user lacks the permission."""


class EtcdRequestTooLarge(RegistryError):
    """A request larger than etcd accepts (``--max-request-bytes``, or gRPC's message limit)."""


class FutureRevision(RegistryError):
    """A read asked for a revision newer than etcd's current one."""


class RevisionCompacted(RegistryError):
    """A read asked for a revision etcd has compacted: relist at the current revision."""


class CompareFailed(RegistryError):
    """A guarded etcd transaction failed its compare: somebody changed the data first."""


class WatchCompacted(RevisionCompacted):
    """A watch's start revision was compacted: relist, then watch from the new revision."""

    def __init__(self, message: str, compacted_revision: int) -> None:
        super().__init__(message)
        self.compacted_revision = compacted_revision


class NotRegistered(RegistryError):
    """The instance has no record in the registry (never joined, left, or its lease expired)."""


class AlreadyRegistered(RegistryError):
    """An instance with this id already has a record in the registry."""


class LeaseLost(RegistryError):
    """The instance's etcd lease expired or was revoked."""


class NoSplittableRange(RegistryError):
    """A join found no range of two or more keys to split."""


class UpstreamError(RangeshardError):
    """An upstream HTTP server answered with an error (``code``, the ``Status`` body as ``status``)."""

    def __init__(self, message: str, code: int = 502, status: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


class UpstreamUnavailable(UpstreamError):
    """The upstream could not be reached (or sent no answer)."""


class UpstreamGone(UpstreamError):
    """The upstream said 410 Gone: the resourceVersion asked for is too old; relist."""

    def __init__(self, message: str, status: dict[str, Any] | None = None) -> None:
        super().__init__(message, 410, status)


class PeerError(RangeshardError):
    """An HTTP/1.1 peer failed a request of ours (:mod:`rangeshard.core.http1client`)."""


class Unreachable(PeerError):
    """No connection could be made, or it closed before any byte of the request left: safe to send again."""


class AnswerLost(PeerError):
    """The request was sent and no answer came (the connection ended or broke): a write may have been applied."""


class BodyBroken(PeerError):
    """The answer's body was cut, malformed, silent for longer than the read timeout, or its reader stopped."""


class LineTooLong(PeerError):
    """A line of a streamed body (a watch event) is longer than ``limit`` bytes."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit

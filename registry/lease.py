"""Lease keepalive we own: renew at TTL/3 (sooner for small TTLs), report failures and the fencing deadline.

Purpose
    pyetcd does not renew leases by itself. :class:`LeaseKeeper` grants a
    lease and runs a named thread that sends one keepalive every ``ttl / 3``
    seconds. It tells its owner, through callbacks, when a renewal succeeded
    (with the new fencing deadline), when one failed (with the deadline that
    still holds), and when the lease is gone for good.

Invariants
    * The **fencing deadline** is measured from the *send* time of the last
      successful keepalive (or grant): etcd cannot expire the lease before
      ``send_time + granted_ttl``, so stopping all work by
      ``send_time + granted_ttl - margin`` (monotonic clock) is safe even if
      the answer arrived late.
    * Each keepalive call has its own deadline (``< interval``), so a hung
      connection is noticed before the fencing deadline; within it the etcd
      client tries the next member of the cluster when one cannot answer
      (:mod:`rangeshard.core.etcd`).
    * Renewals are frequent enough (:func:`renewal_interval`) that a failure
      streak of :data:`ELECTION_ALLOWANCE` seconds (an etcd leader election)
      ends before the fencing deadline for every TTL we accept (>= 3 s).
    * Once etcd answers TTL <= 0 the lease is lost; the keeper stops and calls
      ``on_lost``. It never re-grants by itself: rejoining is the owner's call.

Concurrency model
    One daemon thread per keeper (``lease-keeper-<name>``). Callbacks run on
    that thread and must not block for long. ``deadline`` may be read from any
    thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace

from rangeshard.core.backoff import Backoff
from rangeshard.core.clock import MONOTONIC, Clock
from rangeshard.core.errors import LeaseLost, RangeshardError
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.loops import join_thread, start_thread

log = logging.getLogger(__name__)


def default_margin(ttl: float) -> float:
    """Safety margin before the lease could expire: 30% of the TTL, at least 1 s."""
    return max(1.0, 0.3 * ttl)


#: How long renewals may keep failing without costing the lease: an etcd leader election after the
#: leader died (about 1 s at etcd's default 1 s election timeout) plus the retry that follows it.
ELECTION_ALLOWANCE = 1.5
#: Wait between attempts while renewals fail (each attempt is bounded by its own deadline).
RETRY_WAIT = 0.2


def renewal_interval(ttl: float, margin: float) -> float:
    """Seconds between keepalives: ``ttl / 3``, shorter when the TTL is small.

    After the last renewal the fencing deadline is ``ttl - margin`` away; a
    failure is noticed at most one interval later and must leave
    :data:`ELECTION_ALLOWANCE` of retries before the deadline, so the interval
    is at most ``ttl - margin - ELECTION_ALLOWANCE`` (never below 0.5 s):
    0.5 s for a TTL of 3, 1.3 s for 4, ``ttl / 3`` from 5 on.
    """
    return min(ttl / 3, max(0.5, ttl - margin - ELECTION_ALLOWANCE))


class LeaseKeeper:
    """Grant a lease and keep it alive (see module docstring)."""

    def __init__(
        self,
        config: EtcdConfig,
        ttl: int,
        *,
        name: str = "lease",
        margin: float | None = None,
        on_renewed: Callable[[float], None] | None = None,
        on_failure: Callable[[Exception, float], None] | None = None,
        on_lost: Callable[[], None] | None = None,
        clock: Clock = MONOTONIC,
    ) -> None:
        if ttl < 2:
            raise ValueError(f"lease TTL must be at least 2 seconds, got {ttl}")
        self.ttl = ttl
        self.margin = default_margin(ttl) if margin is None else margin
        if self.margin >= ttl:
            raise ValueError(f"fencing margin {self.margin}s must be below the TTL {ttl}s")
        self.interval = renewal_interval(ttl, self.margin)
        # Calls must finish well within one renewal interval.
        self.client = EtcdClient(replace(config, timeout=max(0.5, min(config.timeout, self.interval * 0.8))))
        self.name = name
        self.clock = clock
        self.on_renewed = on_renewed
        self.on_failure = on_failure
        self.on_lost = on_lost
        self.lease_id: int = 0
        self._deadline = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.lost = threading.Event()
        #: The longest time between two successful renewals (or the grant and the first), in seconds.
        self.longest_gap = 0.0
        self._last_renewed = 0.0

    @property
    def deadline(self) -> float:
        """Monotonic time by which all work must have stopped unless renewed."""
        with self._lock:
            return self._deadline

    def remaining(self) -> float:
        """Seconds left before the fencing deadline (negative: past it)."""
        return self.deadline - self.clock.monotonic()

    def grant(self) -> int:
        """Grant a new lease (raises :class:`~rangeshard.core.errors.RegistryUnavailable`)."""
        sent = self.clock.monotonic()
        self.lease_id = self.client.grant_lease(self.ttl)
        with self._lock:
            self._deadline = sent + self.ttl - self.margin
        self._last_renewed = sent
        self.lost.clear()
        log.info("lease %x granted (ttl %ss) for %s", self.lease_id, self.ttl, self.name)
        return self.lease_id

    def start(self) -> int:
        """Grant the lease if needed and start the keepalive thread; return the lease id."""
        if not self.lease_id:
            self.grant()
        self._stop.clear()
        self._thread = start_thread(f"lease-keeper-{self.name}", self._run, what=f"{self.name}: lease keeper")
        return self.lease_id

    def stop(self, revoke: bool = False) -> None:
        """Stop renewing; with ``revoke`` also revoke the lease (records vanish at once). Idempotent."""
        self._stop.set()
        join_thread(self._thread, self.interval + 5)
        if self._closed:
            return  # stopped before: the client is closed (a second revoke would hit a closed channel)
        self._closed = True
        if revoke and self.lease_id:
            try:
                self.client.revoke_lease(self.lease_id)
                log.info("lease %x revoked", self.lease_id)
            except RangeshardError as e:
                log.warning("could not revoke lease %x (it will expire by itself): %s", self.lease_id, e)
        self.client.close()

    def renew_once(self) -> float:
        """Send one keepalive; return the new deadline. Raises on failure or :class:`LeaseLost`."""
        sent = self.clock.monotonic()
        ttl = self.client.keepalive_once(self.lease_id)
        if ttl <= 0:
            raise LeaseLost(f"lease {self.lease_id:x} expired or was revoked")
        with self._lock:
            self._deadline = max(self._deadline, sent + ttl - self.margin)
            deadline = self._deadline
        if self._last_renewed:
            self.longest_gap = max(self.longest_gap, sent - self._last_renewed)
        self._last_renewed = sent
        return deadline

    def _run(self) -> None:
        wait = self.interval
        failures = 0
        # Constant on purpose: every retry before the fencing deadline counts, so none waits longer than the first.
        retry = Backoff(RETRY_WAIT, RETRY_WAIT)
        while not self._stop.wait(wait):
            try:
                deadline = self.renew_once()
            except LeaseLost as e:
                log.warning("%s: %s", self.name, e)
                self.lost.set()
                if self.on_lost is not None:
                    self.on_lost()
                return
            except RangeshardError as e:
                failures += 1
                remaining = self.remaining()
                # One WARNING per streak of failures (retries come every RETRY_WAIT), then DEBUG.
                log.log(
                    logging.WARNING if failures == 1 else logging.DEBUG,
                    "%s: lease %x renewal failed (%s); fencing deadline in %.1fs",
                    self.name,
                    self.lease_id,
                    e,
                    remaining,
                )
                if self.on_failure is not None:
                    self.on_failure(e, self.deadline)
                wait = min(self.interval, retry.next_delay())
                continue
            if failures:
                log.info(
                    "%s: lease %x renewed again after %d failed attempt(s); deadline in %.1fs",
                    self.name,
                    self.lease_id,
                    failures,
                    deadline - self.clock.monotonic(),
                )
                failures = 0
                retry.reset()
            wait = self.interval
            log.debug(
                "%s: lease %x renewed, deadline in %.1fs",
                self.name,
                self.lease_id,
                deadline - self.clock.monotonic(),
            )
            if self.on_renewed is not None:
                self.on_renewed(deadline)

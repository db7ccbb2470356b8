"""The one retry policy: exponential backoff with jitter, reset after a long enough success.

Purpose
    Every retry loop of the product asks a :class:`Backoff` how long to wait
    before its next attempt. Sans-I/O: it never sleeps; the loop waits
    (``Event.wait``, ``asyncio.sleep``) for the delay it is given, so the
    policy is tested without waiting.

The loops that use it (initial s, maximum s, jitter, reset)
    * the reflector (:mod:`rangeshard.core.reflector`), so both its drivers:
      each proxy watch cache's upstream loop (:mod:`range_filter_proxy.reflector`:
      the cache settings' 0.2 to 10, jitter 0.5, reset by a list) and each
      informer of the controller manager (:mod:`controller_manager.informer`:
      0.2 to 5, reset by a list);
    * the proxy's configured-cache discovery (:mod:`range_filter_proxy.cache`)
      and its KEP-5866 probe (:mod:`range_filter_proxy.shardprobe`): 0.2 to 10;
    * the proxy's progress follower starting the cache of a main resource
      not served yet (:mod:`range_filter_proxy.progress`): 0.5 to 5, jitter
      0.2, reset once every one is followed;
    * a lease's renewal retries (:mod:`registry.lease`): constant, the
      keepalive interval or 0.2 if shorter (every try before the fencing
      deadline counts), reset by a renewal;
    * the registry's transactions that lost a race (:mod:`registry.registry`:
      join, park): 0.01 to 0.1, jitter 0.9, one policy per operation;
    * the local API server's start-up connection to etcd
      (:mod:`local_apiserver.app`): 0.2 to 1; its garbage collector's retries
      of one item (:mod:`local_apiserver.gc`): 0.5 to 5, 30 attempts;
    * a shard instance's registration and heartbeat retries
      (:mod:`controller_manager.sharding`): 1 to 4, jitter 0.2, reset by a
      success;
    * the membership watch (:mod:`registry.watch`): the retry interval to 5 at
      least, jitter 0.2, reset by a healthy watch;
    * etcd member failover (:mod:`rangeshard.core.etcd.members`): 1 to 30 per
      member, reset by an answer;
    * the simulated kubelet (:mod:`local_apiserver.kubelet`): 1 to 10, jitter
      0.2, reset after 10 s of health;
    * the external controller's restarts (:mod:`controller_manager.external.child`)
      and ``rangeshard up``'s manager restarts (:mod:`rangeshard.cli.up`): 1 to
      30, reset by a run of a minute;
    * the test kit's polling ``wait_until`` (:mod:`rangeshard.testing`): 0.02
      growing by half to 0.25.

    Not through it: the workqueue's per-key rate limiter
    (:mod:`controller_manager.workqueue`, client-go's item-exponential limiter:
    one delay per key from its failure count, not one loop's policy).

Invariants
    * Without jitter the n-th delay since the last reset is
      ``min(initial * factor ** (n - 1), maximum)``; with jitter ``j`` it lies in
      ``[d * (1 - j), d * (1 + j)]`` of that ``d``.
    * :meth:`Backoff.reset` makes the next delay ``initial``.
      :meth:`Backoff.succeeded` says the guarded work has been healthy since ``at``:
      with ``reset_after=None`` that resets at once; otherwise the next delay is
      ``initial`` only if it is asked for at least ``reset_after`` seconds after
      ``at`` (a child that ran for a minute restarts at once, one that crashes
      right away keeps backing off).

Concurrency model
    Plain mutable state, not locked: one loop owns one :class:`Backoff` (a
    caller sharing one across threads locks around it, as etcd member health does).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from rangeshard.core.clock import MONOTONIC, Clock
from rangeshard.core.errors import ConfigError


class Backoff:
    """Delays for consecutive failures (see module docstring); ``clock`` and ``rand`` are injectable for tests."""

    def __init__(
        self,
        initial: float,
        maximum: float,
        *,
        factor: float = 2.0,
        jitter: float = 0.0,
        reset_after: float | None = None,
        clock: Clock = MONOTONIC,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if not 0 < initial <= maximum or factor < 1 or not 0 <= jitter < 1:
            raise ConfigError(
                f"backoff: need 0 < initial <= maximum, factor >= 1 and 0 <= jitter < 1 "
                f"(got initial={initial}, maximum={maximum}, factor={factor}, jitter={jitter})"
            )
        self.initial, self.maximum, self.factor, self.jitter = initial, maximum, factor, jitter
        self.reset_after = reset_after
        self._clock, self._rand = clock, rand
        self._next = initial
        self._healthy_since: float | None = None
        #: Delays handed out since the last reset (consecutive failures).
        self.failures = 0

    def next_delay(self) -> float:
        """Seconds to wait before the next attempt; each call counts one more failure."""
        since = self._healthy_since
        if since is not None and self.reset_after is not None and self._clock.monotonic() - since >= self.reset_after:
            self.reset()
        self._healthy_since = None
        delay = self._next
        self._next = min(self._next * self.factor, self.maximum)
        self.failures += 1
        if self.jitter:  # spreads retries of many clients; not synchronisation
            delay *= 1 - self.jitter + 2 * self.jitter * self._rand()
        return delay

    def reset(self) -> None:
        """The next delay is ``initial`` again."""
        self._next = self.initial
        self.failures = 0
        self._healthy_since = None

    def succeeded(self, at: float | None = None) -> None:
        """Healthy since ``at`` (default: now): reset now, or once ``reset_after`` has passed since ``at``."""
        if self.reset_after is None:
            self.reset()
        else:
            self._healthy_since = self._clock.monotonic() if at is None else at

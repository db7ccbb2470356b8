"""The one reflector: paged list, watch from the list's resourceVersion, relist on 410, back off on failures.

Purpose
    A :class:`Reflector` makes client-go's reflector decisions for a loop
    that keeps a local copy of one collection, without doing any I/O itself
    (httpx's pattern: the logic here, the sockets in thin drivers). It says
    which query parameters the next list page takes (``limit``/``continue``),
    when a list is complete and from which resourceVersion to watch, whether
    a watch that ended is re-opened or was a failure, and what a failure
    leads to: a relist at once (410 Gone while watching) or a wait given by
    the loop's :class:`~rangeshard.core.backoff.Backoff`. Two drivers use it:
    the proxy's upstream loop of each watch cache
    (:func:`range_filter_proxy.reflector.reflect`, asyncio) and the
    controller manager's informers (:class:`controller_manager.informer.Informer`,
    one thread each).

Invariants
    * A list asks for pages of ``page_size`` objects; each page after the
      first carries the previous page's ``continue`` token. A list of more
      than ``max_pages`` pages fails (:class:`ReflectorError`).
    * The list's resourceVersion is the first page's (a paged list is one
      consistent read at it); the first watch starts there, later watches
      from the last resourceVersion the driver saw.
    * A successful list resets the backoff; each failure takes its next delay.
    * 410 while watching relists at once; 410 while listing (an expired
      ``continue`` token) is a failure like any other, so a server that keeps
      answering 410 is not hammered.
    * A watch that ends within ``quick_end`` seconds without a line is a
      failure (backed off), not a clean end (re-watched at once).

State machine (``phase``)
    ``LIST`` --:meth:`~Reflector.page` with a ``continue`` token--> ``LIST``;
    ``LIST`` --:meth:`~Reflector.page` without one--> ``WATCH``;
    ``WATCH`` --:meth:`~Reflector.watch_ended` (lines, or a long watch)--> ``WATCH``;
    ``WATCH`` --:meth:`~Reflector.watch_ended` (quick and empty)--> ``WAIT``;
    ``WATCH`` --:meth:`~Reflector.failed` with 410--> ``LIST``;
    any --:meth:`~Reflector.failed` otherwise--> ``WAIT`` (``delay`` set);
    any --:meth:`~Reflector.relist` (after the wait, or the caller wants a
    fresh list)--> ``LIST`` from the first page.

Concurrency model
    Plain mutable state, not locked: one loop (a thread or a task) owns one
    :class:`Reflector`, as it owns its :class:`~rangeshard.core.backoff.Backoff`.
"""

from __future__ import annotations

import enum

from rangeshard.core.backoff import Backoff
from rangeshard.core.errors import RangeshardError

#: Objects per list page (client-go's reflector pages by 500 too; issue 27's memory fix).
LIST_PAGE_SIZE = 500
#: Bound of the paging loop (500 x 100,000 = 50 million objects).
MAX_LIST_PAGES = 100_000
#: A watch that ends sooner than this without a line failed.
QUICK_END_SECONDS = 1.0


class ReflectorError(RangeshardError):
    """A list the reflector gives up on (more pages than its bound)."""


class Phase(enum.Enum):
    """What the driver does next (module docstring: the state machine)."""

    LIST = "list"
    WATCH = "watch"
    WAIT = "wait"


class Reflector:
    """The decisions of one list/watch loop (see module docstring); the driver does the I/O and reports back."""

    def __init__(
        self,
        backoff: Backoff,
        *,
        page_size: int = LIST_PAGE_SIZE,
        max_pages: int = MAX_LIST_PAGES,
        quick_end: float = QUICK_END_SECONDS,
    ) -> None:
        self.backoff = backoff
        self.page_size, self.max_pages, self.quick_end = page_size, max_pages, quick_end
        self.phase = Phase.LIST
        #: Where the next watch starts: the list's resourceVersion, then the last one seen.
        self.resource_version = ""
        #: Seconds to wait while in ``WAIT``.
        self.delay = 0.0
        self._continue = ""
        self._pages = 0

    # -- listing --------------------------------------------------------------
    def list_params(self) -> dict[str, str]:
        """The query parameters of the next list page."""
        params = {"limit": str(self.page_size)}
        if self._continue:
            params["continue"] = self._continue
        return params

    def page(self, resource_version: str, continue_token: str | None) -> Phase:
        """A page arrived: ``LIST`` (ask for the next) or ``WATCH`` (the list is complete, backoff reset)."""
        self._pages += 1
        if not self._continue:
            self.resource_version = resource_version or self.resource_version
        self._continue = continue_token or ""
        if self._continue:
            if self._pages >= self.max_pages:
                raise ReflectorError(f"more than {self.max_pages} list pages of {self.page_size}")
            return self.phase
        self.backoff.succeeded()
        self.phase = Phase.WATCH
        return self.phase

    # -- watching -------------------------------------------------------------
    def watch_ended(self, lines: int, elapsed: float, resource_version: str = "") -> Phase:
        """A watch ended cleanly after ``lines`` lines and ``elapsed`` seconds, having seen ``resource_version``:
        ``WATCH`` (re-watch from there) or ``WAIT`` (it ended at once, empty: a failure)."""
        self.resource_version = resource_version or self.resource_version
        if lines == 0 and elapsed < self.quick_end:
            return self._wait()
        return self.phase

    # -- failures and relists -------------------------------------------------
    def failed(self, code: int | None = None) -> Phase:
        """A list or watch failed (``code``: its HTTP/Status code, if any): ``LIST`` (410 while watching:
        relist at once) or ``WAIT`` (``delay`` set from the backoff)."""
        if code == 410 and self.phase is Phase.WATCH:
            self.relist()
            return self.phase
        return self._wait()

    def relist(self) -> None:
        """List again from the first page (after the wait, or when the caller wants a fresh list)."""
        self.phase = Phase.LIST
        self._continue = ""
        self._pages = 0
        self.resource_version = ""

    def _wait(self) -> Phase:
        self.delay = self.backoff.next_delay()
        self.phase = Phase.WAIT
        return self.phase

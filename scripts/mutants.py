#!/usr/bin/env python3
"""Hand-written mutation testing of the handover modules: break one line, run the tests meant to catch it.

Purpose
    A test suite that passes says little until it is shown to *fail* when the
    code is wrong. Each :class:`Mutant` below is one single-line change to
    ``controller_manager/sharding.py``, ``registry/lease.py``,
    ``registry/registry.py`` or ``controller_manager/workqueue.py`` that breaks
    a handover rule, or to ``range_filter_proxy/fencing.py`` that breaks the
    write fence (or, for the ``equivalent`` ones, is believed not to change
    behaviour: the reason is stated). The script copies the source tree to a
    temporary directory once, applies each mutant there in turn, runs the named
    tests with this interpreter and reports ``killed`` (the tests failed),
    ``survived`` (they passed) or ``error`` (the mutant no longer applies: its
    ``old`` text is not found exactly once, so the list must be updated).

Usage
    ``.venv/bin/python scripts/mutants.py``            every mutant (a few minutes)
    ``.venv/bin/python scripts/mutants.py --key``      the four mutants issue 18 names (CI: ~30 s)
    ``.venv/bin/python scripts/mutants.py --fencing``  the write-fence mutants of issues 30 and 36 (CI)
    ``.venv/bin/python scripts/mutants.py --list``     list the mutants
    ``.venv/bin/python scripts/mutants.py ID...``      only these

    Exit status: 0 when every non-equivalent mutant was killed and every
    equivalent one survived, 1 otherwise, 2 for bad usage or a failing baseline.

Invariants
    * The working tree is never modified: mutants are applied to a copy.
    * The tests run with the copy as working directory and first on
      ``PYTHONPATH``, so both the test process and every child it starts (the
      CLI, managers) import the mutated modules; this is checked before any
      mutant runs, and the unmutated baseline must pass.

Concurrency model
    One mutant at a time, each in a child ``pytest`` process.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SHARDING = "controller_manager/sharding.py"
HANDOVER = "controller_manager/handover.py"
LEASE = "registry/lease.py"
REGISTRY = "registry/registry.py"
WORKQUEUE = "controller_manager/workqueue.py"
FENCING = "range_filter_proxy/fencing.py"

T_SHARD = "tests/controller_manager/test_sharding.py"
T_LEASE = "tests/registry/test_lease.py"
T_REGISTRY = "tests/registry/test_registry.py"
T_QUEUE = "tests/controller_manager/test_workqueue.py"
T_FENCE = "tests/fencing/test_fence_decision.py"


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    what: str
    key: bool = False  # one of the four mutants issue 18 names
    fencing: bool = False  # one of the write-fence mutants of issue 30 (``--fencing``, also run in CI)
    equivalent: str = ""  # why it cannot change behaviour (expected to survive)


MUTANTS: tuple[Mutant, ...] = (
    # -- the four named in issue 18 ---------------------------------------------------------------
    Mutant(
        "drain-skipped",
        HANDOVER,
        "        if not view.inflight_outside and view.drained and not new_epoch:",
        "        if not new_epoch:",
        (f"{T_SHARD}::test_giver_unlocks_its_receiver_only_after_draining_the_keys_it_gave_away",),
        "the giver unlocks its receivers without draining",
        key=True,
    ),
    Mutant(
        "no-fencing-check",
        SHARDING,
        "            if now + self.settings.reconcile_timeout > lease_deadline:",
        "            if False:",
        (f"{T_SHARD}::test_try_begin_refuses_a_reconcile_that_could_outlive_the_fencing_deadline",),
        "try_begin no longer refuses reconciles that could outlive the fencing deadline",
        key=True,
    ),
    Mutant(
        "no-margin-renew",
        LEASE,
        "            self._deadline = max(self._deadline, sent + ttl - self.margin)",
        "            self._deadline = max(self._deadline, sent + ttl)",
        (f"{T_LEASE}::test_renewal_deadline_is_keepalive_send_time_plus_ttl_minus_margin",),
        "a renewal's deadline drops the lease margin",
        key=True,
    ),
    Mutant(
        "reply-time-renew",
        LEASE,
        "        ttl = self.client.keepalive_once(self.lease_id)",
        "        ttl = self.client.keepalive_once(self.lease_id); sent = self.clock.monotonic()",
        (f"{T_LEASE}::test_renewal_deadline_is_keepalive_send_time_plus_ttl_minus_margin",),
        "the deadline is measured from the keepalive reply, not its send time",
        key=True,
    ),
    # -- lease.py ---------------------------------------------------------------------------------
    Mutant(
        "no-margin-grant",
        LEASE,
        "            self._deadline = sent + self.ttl - self.margin",
        "            self._deadline = sent + self.ttl",
        (T_LEASE,),
        "the grant's deadline drops the lease margin",
    ),
    Mutant(
        "reply-time-grant",
        LEASE,
        "        self.lease_id = self.client.grant_lease(self.ttl)",
        "        self.lease_id = self.client.grant_lease(self.ttl); sent = self.clock.monotonic()",
        (T_LEASE,),
        "the grant's deadline is measured from the reply",
    ),
    Mutant(
        "margin-zero",
        LEASE,
        "    return max(1.0, 0.3 * ttl)",
        "    return 0.0",
        (T_LEASE,),
        "the default margin is zero",
    ),
    Mutant(
        "margin-smaller",
        LEASE,
        "    return max(1.0, 0.3 * ttl)",
        "    return max(1.0, 0.2 * ttl)",
        (T_LEASE,),
        "the default margin is 20% instead of 30%",
    ),
    Mutant(
        "renew-interval",
        LEASE,
        "    return min(ttl / 3, max(0.5, ttl - margin - ELECTION_ALLOWANCE))",
        "    return min(ttl / 2, max(0.5, ttl - margin - ELECTION_ALLOWANCE))",
        (T_LEASE,),
        "keepalives every TTL/2 instead of TTL/3",
    ),
    Mutant(
        "lost-at-negative-only",
        LEASE,
        "        if ttl <= 0:",
        "        if ttl < 0:",
        (T_LEASE,),
        "a keepalive answered with TTL 0 is not a lost lease",
    ),
    Mutant(
        "deadline-not-max",
        LEASE,
        "            self._deadline = max(self._deadline, sent + ttl - self.margin)",
        "            self._deadline = sent + ttl - self.margin",
        (T_LEASE,),
        "a renewal may move the deadline back",
        equivalent="send times only grow (monotonic clock) and etcd answers every keepalive with the granted TTL, "
        "so sent + ttl - margin never decreases; the max() is a guard against a shorter TTL in a reply",
    ),
    # -- sharding.py ------------------------------------------------------------------------------
    Mutant(
        "try-begin-out-of-range",
        SHARDING,
        "            if self.allowed is None or not self.allowed.contains(key_hash) or self.leaving:",
        "            if self.allowed is None or self.leaving:",
        (T_SHARD,),
        "try_begin accepts keys outside the allowed range",
    ),
    Mutant(
        "try-begin-no-deadline-cap",
        SHARDING,
        "            return min(now + self.settings.reconcile_timeout, lease_deadline)",
        "            return now + self.settings.reconcile_timeout",
        (T_SHARD,),
        "the reconcile deadline is not capped by the fencing deadline",
        equivalent="try_begin has just refused every reconcile with now + reconcile_timeout > lease_deadline, "
        "so the min() always picks now + reconcile_timeout (the cap is a second guard)",
    ),
    Mutant(
        "fence-late",
        SHARDING,
        "        if self.clock.monotonic() >= keeper.deadline:",
        "        if self.clock.monotonic() > keeper.deadline:",
        (T_SHARD,),
        "fencing only strictly after the deadline",
    ),
    Mutant(
        "no-fence",
        SHARDING,
        "            return replace(local, deadline_passed=True)",
        "            pass",
        (T_SHARD,),
        "the deadline passing does not fence",
    ),
    Mutant(
        "outside-inverted",
        SHARDING,
        "            outside = any(rng is None or not rng.contains(h) for h in self.inflight.values())",
        "            outside = any(rng is None or rng.contains(h) for h in self.inflight.values())",
        (T_SHARD,),
        "the drain waits for the keys the giver keeps instead of those it gives away",
    ),
    Mutant(
        "self-unlock-giver-alive",
        SHARDING,
        "            giver_present=giver_member is not None and not giver_member.record.is_parked,",
        "            giver_present=False,",
        (T_SHARD,),
        "a locked receiver tries to unlock itself while its giver is registered",
        equivalent="Registry.unlock_orphaned's transaction also requires the giver's key to be absent, "
        "so the attempt fails with CompareFailed and nothing changes (defence in depth; "
        "tests/registry/test_registry.py kills the same mutant of the transaction)",
    ),
    Mutant(
        "rejoin-while-busy",
        SHARDING,
        "        if busy:\n            return",
        "        if False:\n            return",
        (T_SHARD,),
        "a lost registration rejoins while reconciles of the old one run",
    ),
    Mutant(
        "unfence-without-relist",
        SHARDING,
        "            self.published_state = None\n            self._new_epoch()",
        "            self.published_state = None",
        (T_SHARD,),
        "unfencing resumes processing on the old caches",
    ),
    Mutant(
        "register-ignores-lock",
        SHARDING,
        "        self.locked = member.record.is_locked",
        "        self.locked = False",
        (T_SHARD,),
        "a locked join is remembered as unlocked",
    ),
    Mutant(
        "locked-processes",
        HANDOVER,
        "            actions.append(SelfUnlock())\n        return actions",
        "            actions.append(SelfUnlock())",
        (T_SHARD,),
        "a locked instance goes on to process keys",
    ),
    Mutant(
        "unlock-ignores-revision",
        SHARDING,
        "                        expected_mod_revision=r.mod_revision,",
        "                        expected_mod_revision=None,",
        (T_SHARD, T_REGISTRY),
        "the unlock does not compare the receiver's mod revision from the drained snapshot",
        equivalent="only a race can tell: between the snapshot and the unlock the receiver's record would have "
        "to change while it stays locked by us; Registry.unlock still requires is_locked and giver == us",
    ),
    # -- registry.py ------------------------------------------------------------------------------
    Mutant(
        "unlock-any-giver",
        REGISTRY,
        "        if not member.record.is_locked or member.record.giver != giver:",
        "        if not member.record.is_locked:",
        (T_REGISTRY,),
        "any instance may unlock a receiver, not only its giver",
    ),
    Mutant(
        "orphan-unlock-unguarded",
        REGISTRY,
        '                extra.append(Compare.version(self.layout.record_key(controller_type, giver), "==", 0))',
        "                pass",
        (T_REGISTRY,),
        "self-unlock does not check that the giver's record is gone",
    ),
    Mutant(
        "join-unlocked",
        REGISTRY,
        '{**base, "hash_key": lower.hi, "is_locked": True, "state": State.LOCKED, "giver": giver}',
        '{**base, "hash_key": lower.hi, "is_locked": False, "state": State.LOCKED, "giver": giver}',
        (T_REGISTRY,),
        "a join that splits a range is not locked",
    ),
    Mutant(
        "set-key-wrong-giver",
        REGISTRY,
        "            receiver, giver = me, succ",
        "            receiver, giver = succ, me",
        (T_REGISTRY,),
        "set-key locks the wrong party when an instance grows",
    ),
    # -- workqueue.py -----------------------------------------------------------------------------
    Mutant(
        "queue-processing-twice",
        WORKQUEUE,
        "        if key in self._processing:\n            return\n        self._queue.append(key)",
        "        self._queue.append(key)",
        (T_QUEUE,),
        "a key being processed is handed to a second worker",
    ),
    Mutant(
        "queue-done-drops-readd",
        WORKQUEUE,
        "            if key in self._dirty:\n                self._queue.append(key)",
        "            pass",
        (T_QUEUE,),
        "a key added while processing is lost",
    ),
    Mutant(
        "queue-no-dedup",
        WORKQUEUE,
        "        if self._shutting_down or key in self._dirty:",
        "        if self._shutting_down:",
        (T_QUEUE,),
        "a queued key is queued twice",
    ),
    Mutant(
        "wait-idle-ignores-processing",
        WORKQUEUE,
        "            while any(keys_predicate(k) for k in self._processing):",
        "            while False:",
        (T_QUEUE,),
        "wait_idle returns while matching keys are processing",
    ),
    # -- range_filter_proxy/fencing.py: the write fence (issue 30; ``--fencing``, run in CI) ---------
    Mutant(
        "fence-epoch-off-by-one",
        FENCING,
        "    if token.epoch < owner.epoch:",
        "    if token.epoch < owner.epoch - 1:",
        (f"{T_FENCE}::test_current_owner_passes_and_stale_writers_are_fenced", f"{T_FENCE}::test_decide"),
        "a token of the previous ownership period still passes",
        fencing=True,
    ),
    Mutant(
        "fence-no-locked",
        FENCING,
        "    if owner.locked:",
        "    if False:",
        (f"{T_FENCE}::test_current_owner_passes_and_stale_writers_are_fenced", f"{T_FENCE}::test_decide"),
        "a locked receiver may write before its giver unlocked it",
        fencing=True,
    ),
    Mutant(
        "fence-no-range",
        FENCING,
        "        if owner.range is None or not owner.range.contains(key):",
        "        if False:",
        (f"{T_FENCE}::test_current_owner_passes_and_stale_writers_are_fenced", f"{T_FENCE}::test_decide"),
        "a write outside the writer's range passes",
        fencing=True,
    ),
    Mutant(
        "batched-read-joins-running",
        FENCING,
        "                batch, self._waiting = self._waiting, []",
        "                batch = self._waiting",
        (f"{T_FENCE}::test_batched_read_never_serves_a_read_started_before_the_caller",),
        "callers arriving while a registry read runs are given that (stale) read's result",
        fencing=True,
    ),
    Mutant(
        "shard-hash-cache-first",
        FENCING,
        "    sources = [o for o in (_object(body), _object(cached)) if o is not None]",
        "    sources = [o for o in (_object(cached), _object(body)) if o is not None]",
        (f"{T_FENCE}::test_undeclared_shard_hash_prefers_the_request_body_over_the_cache",),
        "an undeclared write's shard hash is taken from the cached object before the request body",
        fencing=True,
    ),
    Mutant(
        "fence-ignores-declared-rule",
        FENCING,
        "    if rule is None:",
        "    if True:",
        (f"{T_FENCE}::test_write_keys_follow_the_declared_rule",),
        "the fence guesses (owner, else own uid) instead of applying the rule the writer declared",
        fencing=True,
    ),
)

IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".rangeshard", "*.egg-info"
)


def run_tests(tree: Path, tests: tuple[str, ...], timeout: float) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return -1, "timed out"
    return proc.returncode, proc.stdout + proc.stderr


def check_imports_from(tree: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    code = "import controller_manager.sharding as s, registry.lease as l; print(s.__file__); print(l.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True, check=True
    ).stdout
    for line in out.split():
        if not Path(line).resolve().is_relative_to(tree.resolve()):
            raise SystemExit(f"mutants: the copy is not imported first ({line}); cannot test mutants")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="scripts/mutants.py")
    parser.add_argument("ids", nargs="*", help="only these mutants")
    parser.add_argument("--key", action="store_true", help="only the four mutants named in issue 18")
    parser.add_argument("--fencing", action="store_true", help="only the write-fence mutants (issue 30)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per test run (default 300)")
    args = parser.parse_args(argv)
    known = {m.id: m for m in MUTANTS}
    unknown = [i for i in args.ids if i not in known]
    if unknown:
        print(f"mutants: unknown mutant id(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    if args.ids:
        chosen = [known[i] for i in args.ids]
    elif args.key or args.fencing:
        chosen = [m for m in MUTANTS if (args.key and m.key) or (args.fencing and m.fencing)]
    else:
        chosen = list(MUTANTS)
    if args.list:
        for m in chosen:
            flag = " (key)" if m.key else " (equivalent)" if m.equivalent else ""
            print(f"{m.id:32} {m.path:36} {m.what}{flag}")
        return 0
    with tempfile.TemporaryDirectory(prefix="rangeshard-mutants-") as tmp:
        tree = Path(tmp) / "tree"
        shutil.copytree(ROOT, tree, ignore=IGNORE)
        check_imports_from(tree)
        baseline = tuple(sorted({t for m in chosen for t in m.tests}))
        rc, out = run_tests(tree, baseline, args.timeout)
        if rc != 0:
            print(out[-3000:])
            print("mutants: the unmutated baseline fails; fix that first", file=sys.stderr)
            return 2
        results: list[tuple[Mutant, str, float]] = []
        for m in chosen:
            target = tree / m.path
            original = target.read_text()
            if original.count(m.old) != 1:
                results.append((m, "error", 0.0))
                print(f"{m.id}: ERROR: old text found {original.count(m.old)} times in {m.path}", flush=True)
                continue
            target.write_text(original.replace(m.old, m.new))
            t0 = time.monotonic()
            try:
                rc, out = run_tests(tree, m.tests, args.timeout)
            finally:
                target.write_text(original)
            took = time.monotonic() - t0
            outcome = "survived" if rc == 0 else "killed" if rc in (1, -1) else "error"
            results.append((m, outcome, took))
            print(f"{m.id}: {outcome} ({took:.1f}s) - {m.what}", flush=True)
            if outcome == "error":
                print(out[-2000:])
    bad = [
        (m, outcome) for m, outcome, _ in results if outcome == "error" or (outcome == "survived") != bool(m.equivalent)
    ]
    killed = sum(1 for _, o, _ in results if o == "killed")
    survived = [m.id for m, o, _ in results if o == "survived"]
    print(f"{len(results)} mutants: {killed} killed, {len(survived)} survived {survived}")
    for m, outcome in bad:
        why = f" (expected to survive: {m.equivalent})" if m.equivalent else ""
        print(f"UNEXPECTED {m.id}: {outcome}{why}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

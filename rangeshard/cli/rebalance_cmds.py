"""``rangeshard rebalance``: show imbalance, move one boundary, plan and apply load-aware rebalancing.

Purpose
    ``show`` prints ranges, workloads and max/mean; ``set-key`` moves one
    boundary through the handover protocol; ``plan``/``apply`` equalise owned
    objects (``--by workload``, from the instances' hash histograms) or key
    ranges (``--by range``); ``auto`` applies plans when the imbalance exceeds
    a threshold, with hysteresis. ``pin``/``unpin`` keep an instance's range
    out of every plan and every joiner's split; ``isolate`` gives one
    namespace (``by: namespace``) or label value (``by: label``) an instance
    of its own and pins it.

Invariants
    * Invalid input (unknown instance, colliding key, empty range, key outside
      ``[0, MAX_HASH]``, bad options) and a plan that cannot be made
      (``PlanError``: e.g. ``--by cost`` for a type without reconcile times)
      exit 2 with a message; runtime failures
      (etcd unreachable, handover timeout) exit 1. Never a traceback.
    * ``apply`` never prompts when stdin is not a terminal; on a terminal it
      asks once unless ``--yes``.
    * ``plan`` and ``apply`` propose / apply nothing when the predicted
      max/mean improvement is below ``--min-gain`` (default 0.05); ``apply``
      says so. An unknown ``--type`` (no instance registered) exits 2.
    * Auto mode acts only when max/mean exceeds ``--threshold`` and the plan
      predicts at least ``--min-gain`` improvement, then waits ``--cooldown``;
      after applying it re-arms only once the imbalance fell below
      ``threshold - hysteresis``, so it never flaps.

Concurrency model
    Main thread; ``auto`` stops on SIGINT/SIGTERM.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from hashing import MAX_HASH, ShardBy, hash_key
from rangeshard.cli.common import EtcdOptions, stop_on_signals, unknown_type, with_etcd_options
from rangeshard.cli.tables import table_console
from rangeshard.core.errors import ConfigError, RangeshardError
from rangeshard.core.etcd import EtcdClient
from registry import Registry, Snapshot
from registry.apply import AutoPolicy, apply_plan, set_key_settled, wait_republished, wait_settled
from registry.histogram import COST_UNITS_PER_SECOND
from registry.models import check_name
from registry.rebalance import Move, Plan, Strategy, isolate_plan, loads_of, make_plan, max_over_mean, owned

app = typer.Typer(help="Show and fix the balance of hash ranges between instances.", no_args_is_help=True)

TypeOpt = Annotated[str, typer.Option("--type", "-t", help="Controller type, e.g. replicaset.")]
ByOpt = Annotated[
    str,
    typer.Option(
        "--by",
        help="workload (equal owned objects), cost (equal measured reconcile time) or range (equal key ranges).",
    ),
]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait for each handover.")]
#: A plan whose predicted max/mean improvement is below this proposes nothing.
DEFAULT_MIN_GAIN = 0.05
MinGainOpt = Annotated[
    float,
    typer.Option(
        "--min-gain",
        help="Propose no moves unless they lower max/mean by at least this much (handovers are not free).",
    ),
]


@contextlib.contextmanager
def _registry(options: EtcdOptions) -> Iterator[Registry]:
    """The registry of the command's etcd options, its client closed at the end."""
    with EtcdClient(options.config()) as client:
        yield Registry(client, options.prefix)


def known_snapshot(reg: Registry, controller_type: str) -> Snapshot:
    """The type's snapshot; ConfigError (exit 2) when no instance of that type is registered."""
    check_name("--type", controller_type)
    snap = reg.snapshot(controller_type)
    if not snap.members:
        raise unknown_type(controller_type, reg.snapshots()[1])
    return snap


def gain(plan: Plan, snap: Snapshot | None = None) -> float:
    """Predicted improvement of max/mean of what the plan evens: key ranges for ``--by range`` (with the
    snapshot), else the loads (objects, cost)."""
    sizes = _range_sizes(plan, snap) if Strategy(plan.by) is Strategy.RANGE else None
    if sizes is not None:
        return max_over_mean(sizes[0]) - max_over_mean(sizes[1])
    return plan.current_ratio - plan.predicted_ratio


def gated(plan: Plan, min_gain: float, snap: Snapshot | None = None) -> tuple[Plan, bool]:
    """The plan, or an empty one when its gain is below ``min_gain``; second: whether it was dropped."""
    if min_gain < 0:
        raise ConfigError(f"--min-gain: {min_gain} must be >= 0")
    if not plan.moves or gain(plan, snap) >= min_gain:
        return plan, False
    # Only moves and predicted loads are read from a plan without moves (apply_plan is not called).
    return replace(plan, moves=(), predicted_loads=plan.current_loads), True


#: Seconds ``apply`` waits after the last handover for the instances to publish their new workloads.
REPUBLISH_SECONDS = 15.0


def show_data(snap: Snapshot) -> dict[str, Any]:
    """``show``'s figures; the cost ones are ``None`` (n/a) when no instance published a reconcile time."""
    members = owned(snap)
    loads = [m.record.workload_num for m in members]
    costs = loads_of(snap, Strategy.COST)
    total_objects, total_cost = sum(loads), sum(costs)
    measured = total_cost > 0
    instances = [
        {
            "instanceId": m.instance_id,
            "state": m.record.state.value,
            "isLocked": m.record.is_locked,
            "pinned": m.pinned,
            "hashKey": m.record.hash_key,
            "rangeStart": m.range.lo if m.range else None,
            "rangeEnd": m.range.hi if m.range else None,
            "share": round(m.range.share, 6) if m.range else 0.0,
            "workloadNum": m.record.workload_num,
            "objectShare": round(m.record.workload_num / total_objects, 6) if total_objects else 0.0,
            "costSeconds": round(cost / COST_UNITS_PER_SECOND, 6) if measured else None,
            "costShare": round(cost / total_cost, 6) if measured else None,
        }
        for m, cost in zip(members, costs, strict=True)
    ]
    return {
        "controllerType": snap.controller_type,
        "instances": instances,
        "maxOverMean": round(max_over_mean(loads), 4),
        "costMaxOverMean": round(max_over_mean(costs), 4) if measured else None,
    }


@app.command("show")
@with_etcd_options
def show_command(
    controller_type: TypeOpt,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    *,
    etcd_options: EtcdOptions,
) -> None:
    """Ranges, workloadNum per instance and the max/mean imbalance."""
    with _registry(etcd_options) as reg:
        data = show_data(known_snapshot(reg, controller_type))
    if as_json:
        sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    cost = data["costMaxOverMean"]
    cost_text = f"{cost:.2f}" if cost is not None else "n/a (no reconcile time published)"
    table = Table(
        title=f"{controller_type}: max/mean {data['maxOverMean']:.2f} (objects), {cost_text} (measured cost)",
        title_justify="left",
    )
    for col in ("INSTANCE", "STATE", "LOCKED", "RANGE START", "RANGE END", "SHARE", "WORKLOAD", "OBJECTS", "COST"):
        table.add_column(col)
    for i in data["instances"]:
        table.add_row(
            i["instanceId"],
            i["state"] + (", pinned" if i["pinned"] else ""),
            "yes" if i["isLocked"] else "no",
            str(i["rangeStart"]),
            str(i["rangeEnd"]),
            f"{i['share'] * 100:.2f}%",
            str(i["workloadNum"]),
            f"{i['objectShare'] * 100:.1f}%",
            f"{i['costShare'] * 100:.1f}%" if i["costShare"] is not None else "n/a",
        )
    table_console().print(table)


def _parse_key(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError as e:
        raise ConfigError(f"--key: {text!r} is not an integer (decimal or 0x-hex)") from e
    if not 0 <= value <= MAX_HASH:
        raise ConfigError(f"--key: {value} is outside [0, {MAX_HASH}]")
    return value


@app.command("set-key")
@with_etcd_options
def set_key_command(
    controller_type: TypeOpt,
    instance: Annotated[str, typer.Option("--instance", "-i", help="Instance whose key (upper bound) moves.")],
    key: Annotated[str, typer.Option("--key", "-k", help="New key, decimal or 0x-hex.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Validate and show, change nothing.")] = False,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until the handover finished.")] = True,
    timeout: TimeoutOpt = 60.0,
    *,
    etcd_options: EtcdOptions,
) -> None:
    """Move one boundary; the receiving instance stays locked until the giver has drained."""
    new_key = _parse_key(key)
    with _registry(etcd_options) as reg:
        known_snapshot(reg, controller_type)
        if dry_run:
            before, receiver = reg.set_key(controller_type, instance, new_key, dry_run=True)
        else:
            before, receiver = set_key_settled(reg, controller_type, instance, new_key, timeout)
        giver = "its successor" if receiver is before else instance
        verb = "would move" if dry_run else "moved"
        typer.echo(
            f"{verb} {instance} key {before.record.hash_key} -> {new_key}; "
            f"{receiver.instance_id if receiver else '-'} receives keys from {giver}"
        )
        if not dry_run and wait:
            wait_settled(reg, controller_type, timeout)
            typer.echo("handover finished")


#: What a plan's loads count, per strategy (one metric per sentence).
_LOADS = {Strategy.WORKLOAD: "objects", Strategy.COST: "measured cost", Strategy.RANGE: "objects"}


def _range_sizes(plan: Plan, snap: Snapshot | None) -> tuple[list[int], list[int]] | None:
    """Key-range sizes now and after the plan (instance order), or None without the snapshot."""
    members = owned(snap) if snap is not None else []
    if not members or len(members) != len(plan.targets) or members[0].range is None:
        return None
    now = [m.range.hi - m.range.lo + 1 for m in members if m.range is not None]
    lows = [members[0].range.lo] + [t + 1 for t in plan.targets[:-1]]
    return now, [hi - lo + 1 for lo, hi in zip(lows, plan.targets, strict=True)]


def plan_sentences(plan: Plan, snap: Snapshot | None = None) -> list[str]:
    """What a plan changes, one metric per sentence."""
    what = _LOADS[Strategy(plan.by)]
    loads = (
        f"{what.capitalize()}: max/mean {plan.current_ratio:.2f} -> {plan.predicted_ratio:.2f} "
        f"(now {list(plan.current_loads)}, predicted {list(plan.predicted_loads)})."
    )
    if Strategy(plan.by) is not Strategy.RANGE:
        return [f"{plan.controller_type} by {plan.by}.", loads]
    lines = [f"{plan.controller_type} by range."]
    sizes = _range_sizes(plan, snap)
    if sizes is not None:
        lines.append(f"Key ranges: max/mean {max_over_mean(sizes[0]):.2f} -> {max_over_mean(sizes[1]):.2f}.")
    lines.append(loads.removesuffix(".") + " (assuming objects spread evenly inside each histogram bucket).")
    return lines


def _print_plan(
    console: Console, plan: Plan, dropped: Plan | None = None, min_gain: float = 0.0, snap: Snapshot | None = None
) -> None:
    for line in plan_sentences(plan, snap):
        console.print(line)
    if dropped is not None:
        console.print(
            f"nothing to move: the best plan ({len(dropped.moves)} move(s)) would lower max/mean by only "
            f"{gain(dropped, snap):.3f}, below --min-gain {min_gain:g}"
        )
    elif not plan.moves:
        console.print("nothing to move")
    for m in plan.moves:
        console.print(f"  {m.instance_id}: {m.old_key} -> {m.new_key}")


def _plan_json(
    plan: Plan, dropped: Plan | None = None, min_gain: float = 0.0, snap: Snapshot | None = None
) -> dict[str, Any]:
    return {
        "minGain": min_gain,
        "predictedGain": round(gain(dropped or plan, snap), 4),
        "belowMinGain": dropped is not None,
        "controllerType": plan.controller_type,
        "by": plan.by,
        "moves": [{"instanceId": m.instance_id, "from": m.old_key, "to": m.new_key} for m in plan.moves],
        "currentLoads": list(plan.current_loads),
        "predictedLoads": list(plan.predicted_loads),
        "currentMaxOverMean": round(plan.current_ratio, 4),
        "predictedMaxOverMean": round(plan.predicted_ratio, 4),
    }


@app.command("plan")
@with_etcd_options
def plan_command(
    controller_type: TypeOpt,
    by: ByOpt = "workload",
    min_gain: MinGainOpt = DEFAULT_MIN_GAIN,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    *,
    etcd_options: EtcdOptions,
) -> None:
    """Print the moves that would balance the type and the predicted max/mean.

    No moves are proposed when they would lower max/mean by less than --min-gain.
    """
    with _registry(etcd_options) as reg:
        snap = known_snapshot(reg, controller_type)
        full = make_plan(snap, by)
        plan, was_dropped = gated(full, min_gain, snap)
    dropped = full if was_dropped else None
    if as_json:
        doc = _plan_json(plan, dropped, min_gain, snap)
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _print_plan(table_console(), plan, dropped, min_gain, snap)


@app.command("apply")
@with_etcd_options
def apply_command(
    controller_type: TypeOpt,
    by: ByOpt = "workload",
    min_gain: MinGainOpt = DEFAULT_MIN_GAIN,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    timeout: TimeoutOpt = 60.0,
    *,
    etcd_options: EtcdOptions,
) -> None:
    """Compute the plan and apply it one boundary at a time, waiting for each handover.

    Applies nothing (and says so) when the plan would lower max/mean by less than --min-gain.
    """
    console = table_console()
    with _registry(etcd_options) as reg:
        snap = known_snapshot(reg, controller_type)
        full = make_plan(snap, by)
        plan, was_dropped = gated(full, min_gain, snap)
        _print_plan(console, plan, full if was_dropped else None, min_gain, snap)
        if not plan.moves:
            console.print("nothing applied")
            return
        if not yes and sys.stdin.isatty() and not typer.confirm("apply these moves?"):
            raise typer.Exit(1)

        def progress(done: int, total: int, move: Move) -> None:
            console.print(f"[{done + 1}/{total}] {move.instance_id}: {move.old_key} -> {move.new_key} ...")

        moved = apply_plan(reg, plan, timeout=timeout, progress=progress)
        console.print(f"applied {moved} move(s); waiting for the instances to publish their new workloads ...")
        fresh = wait_republished(reg, controller_type, min(timeout, REPUBLISH_SECONDS))
        ratio = show_data(reg.snapshot(controller_type))["maxOverMean"]
        if fresh:
            console.print(f"registry now: objects max/mean {ratio:.2f} (republished by every instance)")
        else:
            console.print(
                f"registry now: objects max/mean {ratio:.2f} as last published; the new figure is pending "
                f"(predicted {plan.predicted_ratio:.2f}): see `rangeshard rebalance show --type {controller_type}`"
            )


@app.command("auto")
@with_etcd_options
def auto_command(
    controller_type: TypeOpt,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between checks.")] = 30.0,
    threshold: Annotated[float, typer.Option("--threshold", help="Act when max/mean exceeds this.")] = 1.2,
    hysteresis: Annotated[float, typer.Option("--hysteresis", help="Re-arm below threshold - this.")] = 0.05,
    min_gain: MinGainOpt = DEFAULT_MIN_GAIN,
    cooldown: Annotated[float, typer.Option("--cooldown", help="Seconds to wait after applying a plan.")] = 60.0,
    by: ByOpt = "workload",
    once: Annotated[bool, typer.Option("--once", help="Check once and exit.")] = False,
    timeout: TimeoutOpt = 60.0,
    *,
    etcd_options: EtcdOptions,
) -> None:
    """Rebalance automatically when the imbalance exceeds a threshold (with hysteresis)."""
    console = table_console()
    check_name("--type", controller_type)
    if interval <= 0 or cooldown < 0:
        raise ConfigError("auto: need --interval > 0 and --cooldown >= 0")
    strategy = Strategy.parse(by)
    policy = AutoPolicy(threshold, hysteresis, min_gain)
    stop = threading.Event() if once else stop_on_signals()
    with _registry(etcd_options) as reg:
        while not stop.is_set():
            wait = interval
            try:
                snap = reg.snapshot(controller_type)
                ratio = max_over_mean(loads_of(snap, strategy))
                plan = make_plan(snap, strategy) if ratio > threshold and len(owned(snap)) > 1 else None
                decision = policy.decide(ratio, plan)
                if decision == "apply" and plan is not None:
                    _print_plan(console, plan)
                    apply_plan(reg, plan, timeout=timeout)
                    policy.applied()
                    console.print("plan applied")
                    wait = max(interval, cooldown)
                else:
                    console.print(f"max/mean {ratio:.2f}: {decision}")
            except RangeshardError as e:
                console.print(f"[red]{e}[/red]")
            if once:
                return
            stop.wait(wait)


InstanceOpt = Annotated[str, typer.Option("--instance", "-i", help="Instance id.", show_default=False)]


@app.command("pin")
@with_etcd_options
def pin_command(
    controller_type: TypeOpt,
    instance: InstanceOpt,
    *,
    etcd_options: EtcdOptions,
) -> None:
    """Pin an instance: no plan, apply or auto moves its range, and no joiner splits it.

    The pin is a key of its own in etcd (<prefix>/pins/<type>/<instance>), not part of the
    instance's record: it survives the instance's restart under the same id. `set-key` by
    hand still moves it (widening a canary); `unpin` removes it.
    """
    check_name("--instance", instance)
    with _registry(etcd_options) as reg:
        snap = known_snapshot(reg, controller_type)
        created = reg.pin(controller_type, instance)
        member = snap.get(instance)
    rng = member.range if member is not None else None
    where = f"range [{rng.lo}, {rng.hi}]" if rng is not None else "its range"
    if created:
        typer.echo(f"pinned {controller_type}/{instance}: {where} is kept by rebalances and joins")
    else:
        typer.echo(f"{controller_type}/{instance} was already pinned: {where}")


@app.command("unpin")
@with_etcd_options
def unpin_command(
    controller_type: TypeOpt,
    instance: InstanceOpt,
    *,
    etcd_options: EtcdOptions,
) -> None:
    """Remove an instance's pin: rebalances may move its range again and joiners may split it."""
    check_name("--type", controller_type)
    check_name("--instance", instance)
    with _registry(etcd_options) as reg:
        removed = reg.unpin(controller_type, instance)
    typer.echo(f"unpinned {controller_type}/{instance}" if removed else f"{controller_type}/{instance} was not pinned")


@app.command("isolate")
@with_etcd_options
def isolate_command(
    controller_type: TypeOpt,
    instance: InstanceOpt,
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace", "-n", help="The namespace to isolate (a type sharded by: namespace).", show_default=False
        ),
    ] = None,
    label: Annotated[
        str | None,
        typer.Option("--label", help="The label value to isolate (a type sharded by: label).", show_default=False),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    timeout: TimeoutOpt = 60.0,
    *,
    etcd_options: EtcdOptions,
) -> None:
    """Give one namespace (or label value) an instance of its own: ID owns exactly its hash point, pinned.

    For a type whose main resource is sharded `by: namespace` (--namespace) or `by: label`
    (--label VALUE): the keys around the point move (one handover at a time) so that the
    point is a range of its own, owned by --instance, which is then pinned. Refused (exit 2)
    for other rules, and for the first or last instance (their ranges always reach 0 or the
    end of the space).
    """
    console = table_console()
    check_name("--instance", instance)
    if (namespace is None) == (label is None):
        raise ConfigError("isolate: give exactly one of --namespace NS or --label VALUE")
    with _registry(etcd_options) as reg:
        snap = known_snapshot(reg, controller_type)
        point = _isolated_point(snap, namespace, label)
        plan = isolate_plan(snap, instance, point)
        what = f"namespace {namespace}" if namespace is not None else f"label value {label}"
        console.print(f"{controller_type}: {what} is key {point}; {instance} will own exactly [{point}, {point}]")
        for m in plan.moves:
            console.print(f"  {m.instance_id}: {m.old_key} -> {m.new_key}")
        if plan.moves and not yes and sys.stdin.isatty() and not typer.confirm("apply these moves?"):
            raise typer.Exit(1)
        # Pinned first: no joiner splits it and no rebalance moves it while the keys move.
        reg.pin(controller_type, instance)

        def progress(done: int, total: int, move: Move) -> None:
            console.print(f"[{done + 1}/{total}] {move.instance_id}: {move.old_key} -> {move.new_key} ...")

        moved = apply_plan(reg, plan, timeout=timeout, progress=progress, respect_pins=False)
        after = reg.snapshot(controller_type).get(instance)
        rng = after.range if after is not None else None
        if rng is None or (rng.lo, rng.hi) != (point, point):
            raise RangeshardError(f"{instance} owns {rng} after {moved} move(s), not [{point}, {point}]")
        console.print(f"isolated {what} on {controller_type}/{instance}: range [{point}, {point}], pinned")


def _isolated_point(snap: Snapshot, namespace: str | None, label: str | None) -> int:
    """The key of ``namespace`` / the label value, after checking the type's main resource rule (exit 2)."""
    named = [m for m in snap.members if m.record.main_resource is not None]
    main = max(named, key=lambda m: m.mod_revision).record.main_resource if named else None
    if main is None:
        raise ConfigError(
            f"isolate: the instances of {snap.controller_type} publish no main resource, so its shard rule is unknown"
        )
    want = ShardBy.NAMESPACE if namespace is not None else ShardBy.LABEL
    if main.by is not want:
        flag = "--namespace" if namespace is not None else "--label"
        raise ConfigError(
            f"isolate: {flag} needs a type whose main resource is sharded by: {want.value}; "
            f"{snap.controller_type} shards {main.label} by: {main.by.value}"
        )
    value = namespace if namespace is not None else label
    if not value:
        raise ConfigError("isolate: the namespace or label value must not be empty")
    return hash_key(value)

"""Service cluster IPs and node ports, allocated the way kube-apiserver does.

Purpose
    A created Service of type ClusterIP, NodePort or LoadBalancer gets a free
    ``spec.clusterIP`` from the service range (``--service-cluster-ip-range``,
    default ``10.96.0.0/12`` as kube's) unless it asks for one (then it
    must be free and in range) or for ``None`` (headless, kept).
    NodePort/LoadBalancer ports get a free ``nodePort`` from 30000-32767 unless
    they name one. An update may not change ``spec.clusterIP`` (422, "field is
    immutable"); an update that omits it, or a port's ``nodePort``, keeps the
    allocated one. Deleting a Service frees both: allocations are read from the
    stored Services, there is no separate allocator state.

Invariants
    * No two stored Services share a cluster IP or a node port (up to a race
      of two concurrent creates choosing the same free value at random from a
      range of about a million addresses; kube's allocator is a bitmap in etcd).
    * Only ``spec.type: ExternalName`` Services get no cluster IP.

Concurrency model
    Pure functions over the object and the set of values in use, which the
    store reads before it writes.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Iterable
from typing import Any

from local_apiserver.errors import ApiError, invalid

#: kube-apiserver's default ``--service-cluster-ip-range``.
DEFAULT_SERVICE_RANGE = ipaddress.IPv4Network("10.96.0.0/12")
NODE_PORTS = range(30000, 32768)


def in_use(services: Iterable[dict[str, Any]]) -> tuple[set[str], set[int]]:
    """Cluster IPs and node ports the stored ``services`` hold."""
    ips: set[str] = set()
    ports: set[int] = set()
    for svc in services:
        spec = svc.get("spec") or {}
        ip = spec.get("clusterIP")
        if isinstance(ip, str) and ip and ip != "None":
            ips.add(ip)
        for p in spec.get("ports") or []:
            if isinstance(p, dict) and isinstance(p.get("nodePort"), int):
                ports.add(p["nodePort"])
    return ips, ports


def allocate(
    obj: dict[str, Any],
    ips: set[str],
    node_ports: set[int],
    rng: random.Random | None = None,
    network: ipaddress.IPv4Network = DEFAULT_SERVICE_RANGE,
) -> None:
    """Fill ``spec.clusterIP(s)``, port defaults and ``nodePort``s of a Service being created (422 on a conflict)."""
    rnd = rng or random.SystemRandom()
    name = str((obj.get("metadata") or {}).get("name") or "")
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        raise _invalid(name, "spec", "Invalid value: must be an object")
    svc_type = spec.setdefault("type", "ClusterIP")  # (port defaults: local_apiserver.defaults.service_defaults)
    spec.setdefault("sessionAffinity", "None")
    if svc_type != "ExternalName":
        ip = spec.get("clusterIP")
        if ip in (None, ""):
            ip = _free_ip(rnd, ips, name, network)
        elif ip != "None":
            _check_ip(str(ip), ips, name, network)
        spec["clusterIP"] = ip
        spec["clusterIPs"] = [ip]
        if ip != "None":
            spec.setdefault("ipFamilies", ["IPv4"])
            spec.setdefault("ipFamilyPolicy", "SingleStack")
    if svc_type in ("NodePort", "LoadBalancer"):
        taken = set(node_ports)
        for i, p in enumerate(spec.get("ports") or []):
            if not isinstance(p, dict):
                continue
            wanted, field = p.get("nodePort"), f"spec.ports[{i}].nodePort"
            if wanted in (None, 0):
                p["nodePort"] = _free_port(rnd, taken, name)
            elif not isinstance(wanted, int) or wanted not in NODE_PORTS:
                why = "provided port is not in the valid range. The range of valid ports is 30000-32767"
                raise _invalid(name, field, f"Invalid value: {wanted!r}: {why}")
            elif wanted in taken:
                raise _invalid(name, field, f"Invalid value: {wanted}: provided port is already allocated")
            taken.add(p["nodePort"])


def keep_on_update(current: dict[str, Any], new: dict[str, Any]) -> None:
    """An update keeps the allocated cluster IP and node ports; changing the cluster IP is a 422."""
    name = str((current.get("metadata") or {}).get("name") or "")
    cur = current.get("spec") or {}
    spec = new.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    old_ip = cur.get("clusterIP")
    ip = spec.get("clusterIP")
    if old_ip and ip in (None, ""):
        spec["clusterIP"] = old_ip
        spec["clusterIPs"] = cur.get("clusterIPs") or [old_ip]
        for k in ("ipFamilies", "ipFamilyPolicy"):
            if k in cur:
                spec.setdefault(k, cur[k])
    elif old_ip and ip != old_ip:
        raise _invalid(name, "spec.clusterIP", f'Invalid value: "{ip}": field is immutable')
    old_ports = {
        (p.get("port"), p.get("protocol", "TCP")): p.get("nodePort")
        for p in cur.get("ports") or []
        if isinstance(p, dict)
    }
    for p in spec.get("ports") or []:
        if isinstance(p, dict) and p.get("nodePort") in (None, 0):
            kept = old_ports.get((p.get("port"), p.get("protocol", "TCP")))
            if kept:
                p["nodePort"] = kept
    spec.setdefault("type", cur.get("type", "ClusterIP"))
    spec.setdefault("sessionAffinity", cur.get("sessionAffinity", "None"))


def parse_range(text: str) -> ipaddress.IPv4Network:
    """``--service-cluster-ip-range``: an IPv4 CIDR with room for a Service (ValueError with the reason)."""
    try:
        net = ipaddress.IPv4Network(text, strict=True)
    except ValueError as e:
        raise ValueError(f"{text!r} is not an IPv4 CIDR such as 10.96.0.0/12 ({e})") from None
    if net.num_addresses < 8:
        raise ValueError(f"{text!r} is too small (at least a /29)")
    return net


def _free_ip(rnd: random.Random, ips: set[str], name: str, net: ipaddress.IPv4Network) -> str:
    # .0 is the network address and .1 is kube's "kubernetes" Service: start after them.
    for _ in range(1000):
        candidate = str(net.network_address + rnd.randrange(2, net.num_addresses - 1))
        if candidate not in ips:
            return candidate
    raise _invalid(name, "spec.clusterIP", "Internal error: failed to allocate a serviceIP: range is full")


def _check_ip(ip: str, ips: set[str], name: str, network: ipaddress.IPv4Network) -> None:
    try:
        addr = ipaddress.IPv4Address(ip)
    except ValueError:
        raise _invalid(name, "spec.clusterIP", f'Invalid value: "{ip}": must be a valid IP address') from None
    if addr not in network:
        why = f"provided IP is not in the valid range. The range of valid IPs is {network}"
        raise _invalid(name, "spec.clusterIP", f'Invalid value: "{ip}": {why}')
    if ip in ips:
        raise _invalid(name, "spec.clusterIP", f'Invalid value: "{ip}": provided IP is already allocated')


def _free_port(rnd: random.Random, taken: set[int], name: str) -> int:
    for _ in range(1000):
        candidate = rnd.randrange(NODE_PORTS.start, NODE_PORTS.stop)
        if candidate not in taken:
            return candidate
    free = sorted(set(NODE_PORTS) - taken)
    if not free:
        raise _invalid(name, "spec.ports", "Internal error: failed to allocate a nodePort: range is full")
    return free[0]


def _invalid(name: str, field: str, message: str) -> ApiError:
    """422 Invalid of the Service ``name``: one cause."""
    return invalid("Service", name, [(field, message)])

"""A process using our etcd client can fork-and-exec children safely (gRPC's fork handlers are off).

The external controller's child is started with a ``preexec_fn`` (so a real
``fork()``) by a manager whose gRPC channels are busy with a watch and writes.
With gRPC's fork handlers on (its wheels' default) about 4 % of such children
died of SIGABRT before their ``exec``; ``rangeshard.core.etcd`` turns them
off before gRPC loads. The check runs in a fresh interpreter, as a manager is.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from rangeshard.core.etcdserver import EtcdServer

CHILD = textwrap.dedent(
    """
    import ctypes, os, subprocess, sys, threading
    from rangeshard.core.etcd import EtcdClient, EtcdConfig

    cfg = EtcdConfig.from_urls(sys.argv[1])
    prefix = sys.argv[2]
    client = EtcdClient(cfg)
    stop = threading.Event()
    events = []

    def writes():
        c = EtcdClient(cfg)
        for i in range(100_000):
            if stop.is_set():
                break
            c.put(f"{prefix}/{i % 10}", "v")
        c.close()

    watch = client.watch_prefix(prefix + "/", events.append, start_revision=client.revision() + 1)
    writers = [threading.Thread(target=writes) for _ in range(3)]
    for t in writers:
        t.start()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    died = []
    for _ in range(150):
        child = subprocess.run(["/bin/true"], preexec_fn=lambda: libc.prctl(1, 9), check=False)
        if child.returncode != 0:
            died.append(child.returncode)
    stop.set()
    for t in writers:
        t.join(30)
    watch.cancel()
    client.close()
    print("env", os.environ.get("GRPC_ENABLE_FORK_SUPPORT"), "died", died, "events", len(events) > 0, flush=True)
    """
)


def test_forked_children_survive_a_busy_etcd_client(etcd_server: EtcdServer, key_prefix: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, etcd_server.url, key_prefix],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "env false died [] events True" in done.stdout, (done.stdout, done.stderr[-3000:])

"""An unmodified controller: the official Python client's list + watch.Watch(), no rangeshard import.

For every ConfigMap labelled app=ext in the namespace given as argv[1], it
sets data.done to data.want and data.by to the instance it runs under (from
RANGESHARD_INSTANCE_ID, which the manager sets; the controller itself knows
nothing of sharding). It relists on any error, a 410 included.

With a second argument, a file path: the script exits (code 3) as soon as that
file exists, and at once when started while it does (a controller that is down).
"""

import os
import sys
import threading
import time
from pathlib import Path

from kubernetes import client, config, watch

config.load_kube_config()
v1 = client.CoreV1Api()
ns = sys.argv[1]
me = os.environ.get("RANGESHARD_INSTANCE_ID", "?")


def exit_when_down(path):
    while not path.exists():
        time.sleep(0.05)
    print("down file present: exiting", flush=True)
    os._exit(3)


if len(sys.argv) > 2:
    threading.Thread(target=exit_when_down, args=(Path(sys.argv[2]),), daemon=True).start()


def handle(cm):
    data = cm.data or {}
    if data.get("want") is not None and (data.get("done") != data.get("want") or data.get("by") is None):
        v1.patch_namespaced_config_map(cm.metadata.name, ns, {"data": {"done": data["want"], "by": me}})


while True:
    try:
        listed = v1.list_namespaced_config_map(ns, label_selector="app=ext")
        for cm in listed.items:
            handle(cm)
        stream = watch.Watch().stream(
            v1.list_namespaced_config_map,
            ns,
            label_selector="app=ext",
            resource_version=listed.metadata.resource_version,
            timeout_seconds=30,
        )
        for event in stream:
            if event["type"] in ("ADDED", "MODIFIED"):
                handle(event["object"])
    except Exception as e:  # a reset (410), a fenced write (409), the endpoint restarting: relist
        print(f"relisting after {type(e).__name__}: {str(e)[:120]}", flush=True)
        time.sleep(0.2)

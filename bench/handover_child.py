"""The benchmark's controller: a list-then-watch pod informer with nothing but httpx, counting what it receives.

It reads ``KUBECONFIG`` (the endpoint its manager serves), lists ``/api/v1/pods``
without a resourceVersion (a consistent list, as kopf and the official
clients send), watches from the list's resourceVersion, and relists on an
``ERROR`` event or a watch's end, as every client library does. After every
list it appends one JSON line to the file named by ``argv[1]``:
``{"t": monotonic seconds, "items": objects in the list, "events": watch
events received since the previous line}`` (the lines of several processes add up).

Usage: handover_child.py COUNTS_FILE
"""

import json
import os
import sys
import time

import httpx
import yaml

counts = sys.argv[1]
with open(os.environ["KUBECONFIG"]) as kubeconfig:
    server = yaml.safe_load(kubeconfig)["clusters"][0]["cluster"]["server"]
seen = {"events": 0}


def record(items: int) -> None:
    with open(counts, "a") as f:
        f.write(json.dumps({"t": time.monotonic(), "items": items, "events": seen["events"]}) + "\n")
    seen["events"] = 0


with httpx.Client(base_url=server, timeout=httpx.Timeout(60, read=None)) as c:
    for _ in range(100_000):  # every loop bounded
        try:
            listed = c.get("/api/v1/pods")
            doc = listed.json()
            record(len(doc.get("items") or ()))
            rv = doc["metadata"]["resourceVersion"]
            params = {"watch": "true", "resourceVersion": rv, "timeoutSeconds": "600"}
            with c.stream("GET", "/api/v1/pods", params=params) as watch:
                for line in watch.iter_lines():
                    if not line:
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        break
                    seen["events"] += 1
        except (httpx.HTTPError, ValueError, KeyError):
            time.sleep(0.2)

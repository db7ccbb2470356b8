"""Issue 23's "Done when": ``kubectl apply -f`` of one object of each of 40 built-in kinds, then ``kubectl get``.

One multi-document YAML is applied with ``--validate=strict`` (kubectl checks
every field against the server's OpenAPI and the server rejects unknown
fields); then ``kubectl get <resource> <name>`` of each prints kube's columns
(the headers of kube-apiserver 1.32's printers, ``pkg/printers/internalversion``)
and the cells we can predict. Cluster-scoped objects carry the namespace's
name so reruns never collide.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx

MANIFESTS = """
apiVersion: v1
kind: Secret
metadata: {name: sec}
type: Opaque
stringData: {a: "1", b: "2"}
---
apiVersion: v1
kind: Service
metadata: {name: svc}
spec: {selector: {app: web}, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: sa}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm}
data: {x: "1"}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: pvc}
spec: {accessModes: [ReadWriteOnce], storageClassName: fast, resources: {requests: {storage: 1Gi}}}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-NS}
spec:
  capacity: {storage: 5Gi}
  accessModes: [ReadWriteMany, ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: fast
  hostPath: {path: /tmp/pv}
---
apiVersion: v1
kind: Endpoints
metadata: {name: ep}
subsets: [{addresses: [{ip: 10.1.0.1}, {ip: 10.1.0.2}], ports: [{port: 8080}]}]
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: quota}
spec: {hard: {pods: "10", requests.cpu: "2", limits.memory: 2Gi}}
---
apiVersion: v1
kind: LimitRange
metadata: {name: limits}
spec: {limits: [{type: Container, default: {cpu: 500m}}]}
---
apiVersion: v1
kind: PodTemplate
metadata: {name: tmpl}
template:
  metadata: {labels: {app: t, tier: b}}
  spec: {containers: [{name: c, image: registry.local/t:1}]}
---
apiVersion: v1
kind: ReplicationController
metadata: {name: rc}
spec: {replicas: 0, selector: {app: rc}, template: {metadata: {labels: {app: rc}}, spec: {containers: [{name: c, image: i}]}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: deploy}
spec:
  replicas: 0
  selector: {matchLabels: {app: deploy}}
  template: {metadata: {labels: {app: deploy}}, spec: {containers: [{name: c, image: i}]}}
---
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: rs}
spec: {replicas: 0, selector: {matchLabels: {app: rs}}, template: {metadata: {labels: {app: rs}}, spec: {containers: [{name: c, image: i}]}}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: sts}
spec:
  serviceName: sts
  replicas: 2
  selector: {matchLabels: {app: sts}}
  template: {metadata: {labels: {app: sts}}, spec: {containers: [{name: c, image: i}]}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: ds}
spec:
  selector: {matchLabels: {app: ds}}
  template:
    metadata: {labels: {app: ds}}
    spec: {nodeSelector: {disk: ssd}, containers: [{name: c, image: i}]}
---
apiVersion: apps/v1
kind: ControllerRevision
metadata: {name: rev}
revision: 3
data: {spec: {}}
---
apiVersion: batch/v1
kind: Job
metadata: {name: job}
spec: {template: {spec: {restartPolicy: Never, containers: [{name: c, image: i}]}}}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: cron}
spec:
  schedule: "*/5 * * * *"
  jobTemplate: {spec: {template: {spec: {restartPolicy: Never, containers: [{name: c, image: i}]}}}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: hpa}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: deploy}
  minReplicas: 2
  maxReplicas: 7
  metrics: [{type: Resource, resource: {name: cpu, target: {type: Utilization, averageUtilization: 60}}}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: pdb}
spec: {minAvailable: 1, selector: {matchLabels: {app: rs}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: ing}
spec:
  ingressClassName: nginx-NS
  rules: [{host: web.example.org, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: svc, port: {number: 80}}}}]}}]
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: nginx-NS}
spec: {controller: example.org/ingress}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: netpol}
spec: {podSelector: {matchLabels: {app: web}}, policyTypes: [Ingress]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: slice, labels: {kubernetes.io/service-name: svc}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: [10.1.0.1]}, {addresses: [10.1.0.2]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: role}
rules: [{apiGroups: [""], resources: [secrets], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: binding}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: role}
subjects: [{kind: ServiceAccount, name: sa, namespace: NS}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: crole-NS}
rules: [{apiGroups: [""], resources: [nodes], verbs: [list]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: cbinding-NS}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: crole-NS}
subjects: [{kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}]
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: sc-NS}
provisioner: example.org/csi
---
apiVersion: storage.k8s.io/v1
kind: VolumeAttachment
metadata: {name: va-NS}
spec: {attacher: example.org/csi, nodeName: node-1, source: {persistentVolumeName: pv-NS}}
---
apiVersion: storage.k8s.io/v1
kind: CSIStorageCapacity
metadata: {name: cap}
storageClassName: fast
capacity: 10Gi
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: pc-NS}
value: 1000
description: issue 23
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: rtc-NS}
handler: runsc
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: lease}
spec: {holderIdentity: me, leaseDurationSeconds: 10}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: mwh-NS}
webhooks:
- name: m.example.org
  clientConfig: {url: "https://hooks.example.org/m"}
  sideEffects: None
  admissionReviewVersions: [v1]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: vwh-NS}
webhooks:
- name: v1.example.org
  clientConfig: {url: "https://hooks.example.org/v1"}
  sideEffects: None
  admissionReviewVersions: [v1]
- name: v2.example.org
  clientConfig: {url: "https://hooks.example.org/v2"}
  sideEffects: None
  admissionReviewVersions: [v1]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: vap-NS}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments]}]
  validations: [{expression: "object.spec.replicas <= 5"}]
---
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: PriorityLevelConfiguration
metadata: {name: plc-NS}
spec:
  type: Limited
  limited:
    nominalConcurrencyShares: 5
    limitResponse: {type: Queue, queuing: {queues: 8, handSize: 4, queueLengthLimit: 20}}
---
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata: {name: fs-NS}
spec:
  priorityLevelConfiguration: {name: plc-NS}
  matchingPrecedence: 900
  distinguisherMethod: {type: ByUser}
  rules: [{subjects: [{kind: Group, group: {name: "system:authenticated"}}], resourceRules: [{verbs: ["*"], apiGroups: ["*"], resources: ["*"], namespaces: ["*"]}]}]
"""

#: ``resource name -> (kube's header, predicted cells {column: text})``; AGE and other clock cells are not compared.
EXPECTED: dict[tuple[str, str], tuple[list[str], dict[str, str]]] = {
    ("secrets", "sec"): (["NAME", "TYPE", "DATA", "AGE"], {"TYPE": "Opaque", "DATA": "2"}),
    ("services", "svc"): (
        ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"],
        {"TYPE": "ClusterIP", "EXTERNAL-IP": "<none>", "PORT(S)": "80/TCP"},
    ),
    ("serviceaccounts", "sa"): (["NAME", "SECRETS", "AGE"], {"SECRETS": "0"}),
    ("configmaps", "cm"): (["NAME", "DATA", "AGE"], {"DATA": "1"}),
    ("persistentvolumeclaims", "pvc"): (
        ["NAME", "STATUS", "VOLUME", "CAPACITY", "ACCESS MODES", "STORAGECLASS", "VOLUMEATTRIBUTESCLASS", "AGE"],
        {"STATUS": "Pending", "STORAGECLASS": "fast", "VOLUMEATTRIBUTESCLASS": "<unset>"},
    ),
    ("persistentvolumes", "pv-NS"): (
        ["NAME", "CAPACITY", "ACCESS MODES", "RECLAIM POLICY", "STATUS", "CLAIM", "STORAGECLASS",
         "VOLUMEATTRIBUTESCLASS", "REASON", "AGE"],
        {"CAPACITY": "5Gi", "ACCESS MODES": "RWO,RWX", "RECLAIM POLICY": "Retain", "STATUS": "Pending", "STORAGECLASS": "fast"},
    ),
    ("endpoints", "ep"): (["NAME", "ENDPOINTS", "AGE"], {"ENDPOINTS": "10.1.0.1:8080,10.1.0.2:8080"}),
    ("resourcequotas", "quota"): (
        ["NAME", "AGE", "REQUEST", "LIMIT"],
        {"REQUEST": "pods: 0/10, requests.cpu: 0/2", "LIMIT": "limits.memory: 0/2Gi"},
    ),
    ("limitranges", "limits"): (["NAME", "CREATED AT"], {}),
    ("podtemplates", "tmpl"): (
        ["NAME", "CONTAINERS", "IMAGES", "POD LABELS"],
        {"CONTAINERS": "c", "IMAGES": "registry.local/t:1", "POD LABELS": "app=t,tier=b"},
    ),
    ("replicationcontrollers", "rc"): (["NAME", "DESIRED", "CURRENT", "READY", "AGE"], {"DESIRED": "0"}),
    ("deployments", "deploy"): (["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"], {"READY": "0/0"}),
    ("replicasets", "rs"): (["NAME", "DESIRED", "CURRENT", "READY", "AGE"], {"DESIRED": "0"}),
    ("statefulsets", "sts"): (["NAME", "READY", "AGE"], {"READY": "0/2"}),
    ("daemonsets", "ds"): (
        ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "NODE SELECTOR", "AGE"],
        {"NODE SELECTOR": "disk=ssd"},
    ),
    ("controllerrevisions", "rev"): (["NAME", "CONTROLLER", "REVISION", "AGE"], {"CONTROLLER": "<none>", "REVISION": "3"}),
    ("jobs", "job"): (["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"], {}),
    ("cronjobs", "cron"): (
        ["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST SCHEDULE", "AGE"],
        {"SCHEDULE": "*/5 * * * *", "TIMEZONE": "<none>", "SUSPEND": "False", "ACTIVE": "0", "LAST SCHEDULE": "<none>"},
    ),
    ("horizontalpodautoscalers", "hpa"): (
        ["NAME", "REFERENCE", "TARGETS", "MINPODS", "MAXPODS", "REPLICAS", "AGE"],
        {"REFERENCE": "Deployment/deploy", "TARGETS": "cpu: <unknown>/60%", "MINPODS": "2", "MAXPODS": "7"},
    ),
    ("poddisruptionbudgets", "pdb"): (
        ["NAME", "MIN AVAILABLE", "MAX UNAVAILABLE", "ALLOWED DISRUPTIONS", "AGE"],
        {"MIN AVAILABLE": "1", "MAX UNAVAILABLE": "N/A"},
    ),
    ("ingresses", "ing"): (
        ["NAME", "CLASS", "HOSTS", "ADDRESS", "PORTS", "AGE"],
        {"CLASS": "nginx-NS", "HOSTS": "web.example.org", "PORTS": "80"},
    ),
    ("ingressclasses", "nginx-NS"): (
        ["NAME", "CONTROLLER", "PARAMETERS", "AGE"],
        {"CONTROLLER": "example.org/ingress", "PARAMETERS": "<none>"},
    ),
    ("networkpolicies", "netpol"): (["NAME", "POD-SELECTOR", "AGE"], {"POD-SELECTOR": "app=web"}),
    ("endpointslices", "slice"): (
        ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"],
        {"ADDRESSTYPE": "IPv4", "PORTS": "8080", "ENDPOINTS": "10.1.0.1,10.1.0.2"},
    ),
    ("roles", "role"): (["NAME", "CREATED AT"], {}),
    ("rolebindings", "binding"): (["NAME", "ROLE", "AGE"], {"ROLE": "Role/role"}),
    ("clusterroles", "crole-NS"): (["NAME", "CREATED AT"], {}),
    ("clusterrolebindings", "cbinding-NS"): (["NAME", "ROLE", "AGE"], {"ROLE": "ClusterRole/crole-NS"}),
    ("storageclasses", "sc-NS"): (
        ["NAME", "PROVISIONER", "RECLAIMPOLICY", "VOLUMEBINDINGMODE", "ALLOWVOLUMEEXPANSION", "AGE"],
        {"PROVISIONER": "example.org/csi", "RECLAIMPOLICY": "Delete", "VOLUMEBINDINGMODE": "Immediate",
         "ALLOWVOLUMEEXPANSION": "false"},
    ),
    ("volumeattachments", "va-NS"): (
        ["NAME", "ATTACHER", "PV", "NODE", "ATTACHED", "AGE"],
        {"ATTACHER": "example.org/csi", "PV": "pv-NS", "NODE": "node-1", "ATTACHED": "false"},
    ),
    ("csistoragecapacities", "cap"): (
        ["NAME", "STORAGECLASSNAME", "CAPACITY"], {"STORAGECLASSNAME": "fast", "CAPACITY": "10Gi"}
    ),
    ("priorityclasses", "pc-NS"): (
        ["NAME", "VALUE", "GLOBAL-DEFAULT", "AGE", "PREEMPTIONPOLICY"],
        {"VALUE": "1000", "GLOBAL-DEFAULT": "false", "PREEMPTIONPOLICY": "PreemptLowerPriority"},
    ),
    ("runtimeclasses", "rtc-NS"): (["NAME", "HANDLER", "AGE"], {"HANDLER": "runsc"}),
    ("leases", "lease"): (["NAME", "HOLDER", "AGE"], {"HOLDER": "me"}),
    ("mutatingwebhookconfigurations", "mwh-NS"): (["NAME", "WEBHOOKS", "AGE"], {"WEBHOOKS": "1"}),
    ("validatingwebhookconfigurations", "vwh-NS"): (["NAME", "WEBHOOKS", "AGE"], {"WEBHOOKS": "2"}),
    ("validatingadmissionpolicies", "vap-NS"): (
        ["NAME", "VALIDATIONS", "PARAMKIND", "AGE"], {"VALIDATIONS": "1", "PARAMKIND": "<unset>"}
    ),
    ("prioritylevelconfigurations", "plc-NS"): (
        ["NAME", "TYPE", "NOMINALCONCURRENCYSHARES", "QUEUES", "HANDSIZE", "QUEUELENGTHLIMIT", "AGE"],
        {"TYPE": "Limited", "NOMINALCONCURRENCYSHARES": "5", "QUEUES": "8", "HANDSIZE": "4", "QUEUELENGTHLIMIT": "20"},
    ),
    ("flowschemas", "fs-NS"): (
        ["NAME", "PRIORITYLEVEL", "MATCHINGPRECEDENCE", "DISTINGUISHERMETHOD", "AGE", "MISSINGPL"],
        {"PRIORITYLEVEL": "plc-NS", "MATCHINGPRECEDENCE": "900", "DISTINGUISHERMETHOD": "ByUser"},
    ),
}  # fmt: skip


def _table(lines: list[str]) -> tuple[list[str], list[str]]:
    """A kubectl table's header and first row, the row cut at the header's column starts (cells may be empty)."""
    spans = [m.start() for m in re.finditer(r"\S+(?: \S+)*", lines[0])]
    header = [lines[0][a:b].strip() for a, b in zip(spans, [*spans[1:], None], strict=True)]
    row = [lines[1][a:b].strip() for a, b in zip(spans, [*spans[1:], None], strict=True)]
    return header, row


def test_kubectl_applies_forty_kinds_strictly_and_gets_them_with_kube_s_columns(
    kubectl: Callable[..., Any], namespace: str, http: httpx.Client
) -> None:
    docs = MANIFESTS.replace("NS", namespace)
    assert len(EXPECTED) >= 30 and docs.count("\nkind: ") == len(EXPECTED)
    applied = kubectl("apply", "-n", namespace, "--validate=strict", "-f", "-", input=docs)
    created = [line for line in applied.stdout.splitlines() if line.endswith(" created")]
    assert len(created) == len(EXPECTED), applied.stdout + applied.stderr
    assert "Warning" not in applied.stderr, applied.stderr  # strict: not even an unknown-field warning

    wrong = []
    for (resource, pattern), (header, cells) in EXPECTED.items():
        name = pattern.replace("NS", namespace)
        lines = kubectl("get", resource, name, "-n", namespace).stdout.splitlines()
        got_header, row = _table(lines)
        if got_header != header or row[0] != name:
            wrong.append(f"{resource}: {lines}")
            continue
        for column, text in cells.items():
            if row[header.index(column)] != text.replace("NS", namespace):
                wrong.append(f"{resource}: {column} = {row[header.index(column)]!r}, want {text!r}")
    assert not wrong, "\n".join(wrong)

    # The same HPA read as autoscaling/v1 (converted from the stored v2) prints the same columns and cells.
    head, row = _table(
        kubectl("get", "horizontalpodautoscalers.v1.autoscaling", "hpa", "-n", namespace).stdout.splitlines()
    )
    assert head == EXPECTED[("horizontalpodautoscalers", "hpa")][0], head
    assert row[1:5] == ["Deployment/deploy", "cpu: <unknown>/60%", "2", "7"], row

    # An HPA with a metric v1 cannot express: its v1 read still prints every metric (kube prints the internal form).
    two = {
        "type": "Pods",
        "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "10"}},
    }
    patched = http.patch(
        f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/hpa",
        json={"spec": {"metrics": [two, {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}}}]}},
        headers={"Content-Type": "application/merge-patch+json"},
    )  # fmt: skip
    assert patched.status_code == 200, patched.text
    for resource in ("horizontalpodautoscalers.v2.autoscaling", "horizontalpodautoscalers.v1.autoscaling"):
        _, row = _table(kubectl("get", resource, "hpa", "-n", namespace).stdout.splitlines())
        assert row[2] == "<unknown>/10, cpu: <unknown>/60%", (resource, row)

    # `-o wide` adds the priority-1 columns where kube has them.
    head, row = _table(kubectl("get", "cronjobs", "cron", "-n", namespace, "-o", "wide").stdout.splitlines())
    assert head[-3:] == ["CONTAINERS", "IMAGES", "SELECTOR"] and row[-3:] == ["c", "i", "<none>"], (head, row)
    head, row = _table(kubectl("get", "pvc", "pvc", "-n", namespace, "-o", "wide").stdout.splitlines())
    assert head[-1] == "VOLUMEMODE" and row[-1] == "Filesystem", (head, row)

    # Strict validation refuses an unknown field in any of them (kubectl's own check, before the server).
    bad = kubectl(
        "apply", "-n", namespace, "--validate=strict", "-f", "-", check=False,
        input="apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: bad}\nhandler: x\nhandlr: y\n",
    )  # fmt: skip
    assert bad.returncode != 0 and 'unknown field "handlr"' in bad.stderr, bad.stderr
    assert http.get("/apis/node.k8s.io/v1/runtimeclasses/bad").status_code == 404

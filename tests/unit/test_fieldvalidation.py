"""Field validation and OpenAPI for built-in kinds and for a served CRD version (the ResourceSpec hook of issue 13)."""

from __future__ import annotations

from typing import Any

import pytest

from local_apiserver import fieldvalidation, openapi
from local_apiserver.errors import ApiError
from local_apiserver.resources import ResourceSpec, lookup
from rangeshard.core.tables import PrinterColumn

WIDGET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "size": {"type": "integer"},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        }
    },
}
WIDGETS = ResourceSpec(
    "example.com",
    "v1",
    "widgets",
    "Widget",
    True,
    "widget",
    schema=WIDGET_SCHEMA,
    printer_columns=(PrinterColumn("Size", "integer", ".spec.size"),),
)


def test_builtin_unknown_fields_paths_and_pruning() -> None:
    spec = lookup("apps", "v1", "deployments")
    assert spec is not None
    obj: dict[str, Any] = {
        "metadata": {"name": "d", "bogus": 1, "labels": {"free": "form"}},
        "spec": {
            "replicas": 1,
            "strategy": {"rollingUpdate": {"maxSurge": "25%"}},
            "template": {"spec": {"containers": [{"name": "c", "nope": True}]}},
        },
    }
    with pytest.raises(ApiError) as err:
        fieldvalidation.check(spec, "Strict", obj, ("replicas",))
    assert err.value.code == 400
    assert err.value.message.endswith(
        'strict decoding error: duplicate field "replicas", unknown field "metadata.bogus", '
        'unknown field "spec.template.spec.containers[0].nope"'
    )
    assert "bogus" in obj["metadata"]  # Strict writes nothing, prunes nothing
    assert fieldvalidation.check(spec, "Ignore", obj) == []
    assert "bogus" not in obj["metadata"] and obj["spec"]["template"]["spec"]["containers"] == [{"name": "c"}]
    assert fieldvalidation.duplicate_fields(b'{"a":{"b":1,"b":2},"c":3}', "application/json") == ("b",)
    assert fieldvalidation.duplicate_fields(b"a: 1\nb: {c: 1, c: 2}\n", "application/yaml") == ("c",)
    assert fieldvalidation.warning_headers(['unknown field "x"']) == [("Warning", '299 - "unknown field \\"x\\""')]


def test_crd_schema_hook() -> None:
    obj: dict[str, Any] = {"metadata": {"name": "w"}, "spec": {"size": 1, "colour": "red", "extra": {"any": 1}}}
    assert fieldvalidation.check(WIDGETS, "Warn", obj) == ['unknown field "spec.colour"']
    assert obj["spec"] == {"size": 1, "extra": {"any": 1}}
    doc = openapi.v3_group_document([WIDGETS], "example.com", "v1")
    assert doc is not None
    schema = doc["components"]["schemas"]["com.example.v1.Widget"]
    assert schema["x-kubernetes-group-version-kind"] == [{"group": "example.com", "version": "v1", "kind": "Widget"}]
    assert "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" in doc["components"]["schemas"]
    patch = doc["paths"]["/apis/example.com/v1/namespaces/{namespace}/widgets/{name}"]["patch"]
    assert "application/strategic-merge-patch+json" not in patch["requestBody"]["content"]
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]


def test_warning_headers_are_printable_ascii_whatever_the_field_name() -> None:
    names = ["spec.\x1f", 'spec."q"\\', "spec.\U00051b5d\udb6c", "spec.caf\u00e9"]
    headers = fieldvalidation.warning_headers([f'unknown field "{n}"' for n in names])
    assert [k for k, _ in headers] == ["Warning"] * len(names)
    for _, value in headers:
        assert value.startswith('299 - "') and value.endswith('"')
        assert all(" " <= ch <= "~" for ch in value), value
        value.encode("latin-1")  # what the HTTP server requires
    assert "\\u001f" in headers[0][1] and '\\"q\\"\\\\' in headers[1][1] and "\\U00051b5d" in headers[2][1]

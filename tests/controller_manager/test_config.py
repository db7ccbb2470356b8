"""Manager config: example files load, every problem is one exact `FILE: field.path: problem` line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from controller_manager.config import (
    KNOWN_CONTROLLERS,
    ControllerSection,
    ManagerConfig,
    config_reference_markdown,
    load_config,
    with_overrides,
)
from controller_manager.plugins import available
from rangeshard.cli.main import app
from rangeshard.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
MINIMAL = "controllers: {replicaset: }\n"


def write(tmp_path: Path, text: str, name: str = "manager.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    return ei.value.problems


def test_local_yaml_is_what_rangeshard_up_needs() -> None:
    cfg = load_config(REPO / "config" / "local.yaml")
    assert cfg.etcd.endpoints == ("http://127.0.0.1:2379",)
    assert cfg.proxy.url == "http://127.0.0.1:8001"
    assert cfg.lease_ttl_seconds == 10
    assert cfg.controllers == {"replicaset": ControllerSection(workers=4), "deployment": ControllerSection(workers=2)}


def test_example_yaml_loads() -> None:
    cfg = load_config(REPO / "config" / "example.yaml")
    assert set(cfg.controllers) == set(KNOWN_CONTROLLERS)
    assert cfg.metrics is not None and cfg.metrics.port == 9090


def test_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, MINIMAL))
    assert cfg.etcd.endpoints == ("http://127.0.0.1:2379",)
    assert cfg.etcd.password is None
    assert cfg.proxy.url == "http://127.0.0.1:8001"
    assert cfg.lease_ttl_seconds == 10
    assert cfg.registry_prefix == "/rangeshard"
    assert cfg.instance_id_prefix is None
    assert cfg.reconcile_timeout_seconds == 3.0
    assert cfg.metrics is not None and (cfg.metrics.host, cfg.metrics.port) == ("127.0.0.1", 0)
    assert cfg.controllers == {"replicaset": ControllerSection(workers=1)}


@pytest.mark.parametrize("entry", ["deployment:", "deployment: {}", "deployment: null", "deployment: {workers: 1}"])
def test_controller_without_mapping_gets_one_worker(tmp_path: Path, entry: str) -> None:
    cfg = load_config(write(tmp_path, f"controllers:\n  {entry}\n"))
    assert cfg.controllers == {"deployment": ControllerSection(workers=1)}


def test_metrics_null_disables_and_whole_numbers_are_floats(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "metrics: null\nreconcileTimeoutSeconds: 2\n" + MINIMAL))
    assert cfg.metrics is None
    assert cfg.reconcile_timeout_seconds == 2.0


def test_full_valid_config(tmp_path: Path) -> None:
    (tmp_path / "certs").mkdir()
    for name in ("ca.pem", "client.pem", "client-key.pem"):
        (tmp_path / "certs" / name).write_text("x")
    text = """
etcd:
  endpoints: ["https://etcd-0:2379", "https://etcd-1.example.com:2379/"]
  caCert: certs/ca.pem
  cert: certs/client.pem
  key: certs/client-key.pem
  username: root
  password: s3cr3t-value
proxy: {url: "https://proxy.example.com/k8s/"}
leaseTTLSeconds: 30
registryPrefix: /prod/rangeshard
instanceIdPrefix: node-7-
reconcileTimeoutSeconds: 14.5
metrics: {host: 0.0.0.0, port: 9100}
controllers: {replicaset: {workers: 64}, deployment: {workers: 1}}
"""
    cfg = load_config(write(tmp_path, text))
    assert cfg.etcd.endpoints == ("https://etcd-0:2379", "https://etcd-1.example.com:2379")
    assert cfg.etcd.ca_cert == str((tmp_path / "certs" / "ca.pem").resolve())
    assert cfg.etcd.key == str((tmp_path / "certs" / "client-key.pem").resolve())
    assert cfg.etcd.password is not None and cfg.etcd.password.get_secret_value() == "s3cr3t-value"
    assert cfg.proxy.url == "https://proxy.example.com/k8s"
    assert cfg.registry_prefix == "/prod/rangeshard"
    assert cfg.instance_id_prefix == "node-7-"
    assert cfg.controllers["replicaset"].workers == 64
    assert "s3cr3t-value" not in repr(cfg) and "s3cr3t-value" not in str(cfg)


WANT = "; want http(s)://HOST[:PORT] or HOST:PORT"  # the etcd endpoint grammar

# One invalid field per case: (yaml added to the minimal config, expected "field.path: problem").
INVALID = [
    ("etcd: {endpoints: []}", "etcd.endpoints: at least one endpoint is required"),
    (
        'etcd: {endpoints: ["ftp://h:2379"]}',
        "etcd.endpoints.0: etcd endpoint 'ftp://h:2379': scheme must be http or https" + WANT,
    ),
    (
        'etcd: {endpoints: ["http://h:1", "http://:2379"]}',
        "etcd.endpoints.1: etcd endpoint 'http://:2379': no host" + WANT,
    ),
    (
        'etcd: {endpoints: ["http://h:70000"]}',
        "etcd.endpoints.0: etcd endpoint 'http://h:70000': invalid URL (Port out of range 0-65535)" + WANT,
    ),
    (
        'etcd: {endpoints: ["http://h:0"]}',
        "etcd.endpoints.0: etcd endpoint 'http://h:0': port must be 1-65535" + WANT,
    ),
    (
        'etcd: {endpoints: ["http://h:2379/v3"]}',
        "etcd.endpoints.0: etcd endpoint 'http://h:2379/v3': expected scheme://host:port and nothing else" + WANT,
    ),
    (
        'etcd: {endpoints: ["http://u:pw@h:2379"]}',
        "etcd.endpoints.0: etcd endpoint 'http://***@h:2379': credentials do not belong in the URL "
        "(use the etcd user and password settings)" + WANT,
    ),
    (
        'etcd: {endpoints: ["http://h:2379?x=1"]}',
        "etcd.endpoints.0: etcd endpoint 'http://h:2379?x=1': expected scheme://host:port and nothing else" + WANT,
    ),
    (
        "etcd: {endpoints: [foo]}",
        "etcd.endpoints.0: etcd endpoint 'foo': not a valid URL" + WANT,
    ),
    ("etcd: {endpoints: http://h:2379}", "etcd.endpoints: Input should be a valid tuple"),
    ("etcd: {cert: c.pem}", "etcd.key: cert and key must be given together"),
    ("etcd: {key: k.pem}", "etcd.cert: cert and key must be given together"),
    ("etcd: {username: bob}", "etcd.password: username and password must be given together"),
    ("etcd: 5", "etcd: expected a mapping"),
    (
        "etcd: {endpoint: x}",
        "etcd.endpoint: unknown field; expected one of: caCert, cert, endpoints, key, password, username",
    ),
    ("proxy: {url: localhost:8001}", "proxy.url: URL scheme must be http or https"),
    ("proxy: {url: http://localhost:8001/#top}", "proxy.url: URL must not have a query or fragment"),
    (
        "proxy: {}\nproxy2: 1",
        "proxy2: unknown field; expected one of: controllers, costWindowSeconds, etcd, instanceIdPrefix, leaseTTLSeconds, metrics, proxy, reconcileTimeoutSeconds, registryPrefix, rejoinGraceSeconds, stuckAfterSeconds, watchdog",
    ),
    ("leaseTTLSeconds: 2", "leaseTTLSeconds: Input should be greater than or equal to 3"),
    ("leaseTTLSeconds: 301", "leaseTTLSeconds: Input should be less than or equal to 300"),
    ("leaseTTLSeconds: 10.5", "leaseTTLSeconds: Input should be a valid integer"),
    ('leaseTTLSeconds: "10"', "leaseTTLSeconds: Input should be a valid integer"),
    (
        "lease_ttl_seconds: 10",
        "lease_ttl_seconds: unknown field; expected one of: controllers, costWindowSeconds, etcd, instanceIdPrefix, leaseTTLSeconds, metrics, proxy, reconcileTimeoutSeconds, registryPrefix, rejoinGraceSeconds, stuckAfterSeconds, watchdog",
    ),
    (
        "registryPrefix: rangeshard",
        "registryPrefix: must be an absolute key prefix such as /rangeshard (/name[/name...], no empty segments)",
    ),
    (
        "registryPrefix: /rangeshard//x",
        "registryPrefix: must be an absolute key prefix such as /rangeshard (/name[/name...], no empty segments)",
    ),
    (
        "instanceIdPrefix: Node/1",
        "instanceIdPrefix: must be 1..200 characters of lowercase letters, digits, '-', '_' or '.', starting with a letter or digit",
    ),
    ("reconcileTimeoutSeconds: 0", "reconcileTimeoutSeconds: Input should be greater than 0"),
    ("reconcileTimeoutSeconds: .nan", "reconcileTimeoutSeconds: Input should be a finite number"),
    ("reconcileTimeoutSeconds: true", "reconcileTimeoutSeconds: Input should be a valid number"),
    ("reconcileTimeoutSeconds: 5", "reconcileTimeoutSeconds: must be less than leaseTTLSeconds / 2 (5)"),
    (
        "leaseTTLSeconds: 3\nreconcileTimeoutSeconds: 1.5",
        "reconcileTimeoutSeconds: must be less than leaseTTLSeconds / 2 (1.5)",
    ),
    ("metrics: {port: 65536}", "metrics.port: Input should be less than or equal to 65535"),
    ("metrics: {host: ''}", "metrics.host: String should have at least 1 character"),
    ("metrics: {path: /m}", "metrics.path: unknown field; expected one of: host, port"),
    ("metrics: true", "metrics: expected a mapping"),
]


@pytest.mark.parametrize(("extra", "expected"), INVALID)
def test_each_invalid_field_yields_exactly_one_line(tmp_path: Path, extra: str, expected: str) -> None:
    path = write(tmp_path, MINIMAL + extra + "\n")
    assert problems_of(path) == [f"{path}: {expected}"]


# Built-ins plus the plugins installed in this environment (the widgets example registers "widget").
KNOWN = ", ".join(sorted(available()))

INVALID_CONTROLLERS = [
    (
        "controllers: {replicaset: {workers: 0}}",
        "controllers.replicaset.workers: Input should be greater than or equal to 1",
    ),
    (
        "controllers: {replicaset: {workers: 65}}",
        "controllers.replicaset.workers: Input should be less than or equal to 64",
    ),
    ("controllers: {replicaset: {workers: '4'}}", "controllers.replicaset.workers: Input should be a valid integer"),
    ("controllers: {replicaset: {workers: true}}", "controllers.replicaset.workers: Input should be a valid integer"),
    (
        "controllers: {replicaset: {threads: 4}}",
        "controllers.replicaset.threads: unknown field; expected one of: class, external, reconcileDelaySeconds, reconcileHoldFile, shard, workers",
    ),
    ("controllers: {replicaset: 4}", "controllers.replicaset: expected a mapping"),
    (
        "controllers: {statefulset: {}}",
        f"controllers.statefulset: unknown controller (known: {KNOWN}); or give class: 'module:Class'",
    ),
    ("controllers: {}", "controllers: at least one controller is required (known: replicaset, deployment)"),
    ("controllers:", "controllers: at least one controller is required (known: replicaset, deployment)"),
    ("controllers: [replicaset]", "controllers: expected a mapping"),
    ("etcd: {}", "controllers: required field is missing"),
]


@pytest.mark.parametrize(("text", "expected"), INVALID_CONTROLLERS)
def test_invalid_controllers(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text + "\n")
    assert problems_of(path) == [f"{path}: {expected}"]


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path, "leaseTTLSeconds: 1\nproxy: {url: x}\ncontrollers: {replicaset: {workers: 0}, foo: }\nbar: 1\n"
    )
    problems = problems_of(path)
    assert problems == [
        f"{path}: proxy.url: URL scheme must be http or https",
        f"{path}: leaseTTLSeconds: Input should be greater than or equal to 3",
        f"{path}: controllers.replicaset.workers: Input should be greater than or equal to 1",
        f"{path}: bar: unknown field; expected one of: controllers, costWindowSeconds, etcd, instanceIdPrefix, leaseTTLSeconds, metrics, proxy, reconcileTimeoutSeconds, registryPrefix, rejoinGraceSeconds, stuckAfterSeconds, watchdog",
        f"{path}: controllers.foo: unknown controller (known: {KNOWN}); or give class: 'module:Class'",
    ]


def test_missing_certificate_files(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "etcd: {caCert: ca.pem, cert: /nonexistent/c.pem, key: /nonexistent/k.pem}\n")
    assert problems_of(path) == [
        f"{path}: etcd.caCert: file not found: {(tmp_path / 'ca.pem').resolve()}",
        f"{path}: etcd.cert: file not found: /nonexistent/c.pem",
        f"{path}: etcd.key: file not found: /nonexistent/k.pem",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("controllers:\n  replicaset: {workers: 2\netcd: {}\n", "3:5: invalid YAML: expected ',' or '}', but got ':'"),
        ("controllers:\n\treplicaset:\n", "2:1: invalid YAML: found character '\\t' that cannot start any token"),
        (
            "controllers: {replicaset: }\nleaseTTLSeconds: 10\nleaseTTLSeconds: 20\n",
            "3:1: invalid YAML: found duplicate key 'leaseTTLSeconds' (first on line 2)",
        ),
        (
            "controllers:\n  replicaset:\n  replicaset: {workers: 2}\n",
            "3:3: invalid YAML: found duplicate key 'replicaset' (first on line 2)",
        ),
    ],
)
def test_yaml_errors_carry_line_and_column(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    assert problems_of(path) == [f"{path}:{expected}"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "top level must be a mapping, got an empty file"),
        ("- a\n", "top level must be a mapping, got a list"),
        ("42\n", "top level must be a mapping, got a int"),
    ],
)
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    assert problems_of(path) == [f"{path}: {expected}"]


def test_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    problems = problems_of(missing)
    assert len(problems) == 1 and problems[0].startswith(f"{missing}: cannot read: ")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"controllers: {replicaset: }\n\xff\xfe")
    assert problems_of(binary) == [f"{binary}: not valid UTF-8 (byte 28)"]


SECRET = "hunter2-TOP-secret"


@pytest.mark.parametrize(
    "text",
    [
        f"etcd: {{password: {SECRET}}}\n" + MINIMAL,  # username missing
        f"etcd: {{username: u, password: [{SECRET}]}}\n" + MINIMAL,  # wrong type
        f"etcd: {{username: u, password: {SECRET}, extra: {SECRET}}}\n" + MINIMAL,  # unknown field
        f"etcd:\n  username: u\n  password: {SECRET}\n  endpoints: ['http://u:{SECRET}@h:1']\n" + MINIMAL,
        f"etcd:\n  username: u\n  password: '{SECRET}\n",  # unterminated quote
        f"etcd:\n  password: {SECRET}\n\tbad: 1\n",  # tab
    ],
)
def test_secrets_never_appear_in_errors(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    rendered = str(ei.value) + "\n".join(ei.value.problems) + repr(ei.value)
    assert SECRET not in rendered


def test_secret_not_in_repr_or_dump(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, f"etcd: {{username: u, password: {SECRET}}}\n" + MINIMAL))
    assert SECRET not in repr(cfg)
    assert SECRET not in repr(cfg.etcd)
    assert SECRET not in cfg.model_dump_json()
    assert cfg.etcd.password is not None and cfg.etcd.password.get_secret_value() == SECRET


def test_config_is_frozen(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, MINIMAL))
    with pytest.raises(ValueError, match="frozen"):
        cfg.lease_ttl_seconds = 5  # type: ignore[misc]


# -- CLI overrides ----------------------------------------------------------


def test_with_overrides(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "etcd: {username: u, password: p}\n" + MINIMAL))
    out = with_overrides(cfg, etcd=" http://a:1, https://b:2/ ,", proxy="http://p:9/")
    assert out.etcd.endpoints == ("http://a:1", "https://b:2")
    assert out.etcd.username == "u"  # the rest of the section is kept
    assert out.proxy.url == "http://p:9"
    assert cfg.etcd.endpoints == ("http://127.0.0.1:2379",)  # the original is untouched
    assert with_overrides(cfg) == cfg
    assert with_overrides(cfg, proxy="http://q:1").etcd == cfg.etcd


def test_with_overrides_rejects_bad_urls(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, MINIMAL))
    with pytest.raises(ConfigError) as ei:
        with_overrides(cfg, etcd="http://ok:1,ftp://bad:2,http://:3")
    assert ei.value.problems == [
        "--etcd: etcd endpoint 'ftp://bad:2': scheme must be http or https" + WANT,
        "--etcd: etcd endpoint 'http://:3': no host" + WANT,
    ]
    with pytest.raises(ConfigError, match="no endpoint"):
        with_overrides(cfg, etcd=" , ")
    with pytest.raises(ConfigError) as ei:
        with_overrides(cfg, proxy="proxy:8001")
    assert ei.value.problems == ["--proxy: proxy:8001: URL scheme must be http or https"]


# -- reference docs ------------------------------------------------------------


def test_docs_configuration_md_is_generated() -> None:
    doc = (REPO / "docs" / "configuration.md").read_text()
    assert doc == config_reference_markdown(), (
        "regenerate: python -c 'from controller_manager.config import config_reference_markdown as f; print(f(), end=\"\")' > docs/configuration.md"
    )


def test_reference_documents_every_field_and_its_example_loads(tmp_path: Path) -> None:
    doc = config_reference_markdown()
    for model, prefix in [(ManagerConfig, "")]:
        for name, field in model.model_fields.items():
            assert f"`{prefix}{field.alias or name}`" in doc
    for path in ["etcd.caCert", "etcd.password", "proxy.url", "metrics.port", "controllers.<name>.workers"]:
        assert f"`{path}`" in doc
    example = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    cfg = load_config(write(tmp_path, example))
    assert cfg == ManagerConfig.model_validate(yaml.safe_load(example))
    assert set(cfg.controllers) == set(KNOWN_CONTROLLERS)


@pytest.mark.parametrize(("ttl", "expected"), [(3, 0.9), (4, 1.2), (10, 3.0), (300, 3.0)])
def test_reconcile_timeout_defaults_from_the_lease_ttl(tmp_path: Path, ttl: int, expected: float) -> None:
    # any valid TTL works alone: the default timeout is min(3, 0.3 * TTL), always below TTL / 2
    cfg = load_config(write(tmp_path, f"leaseTTLSeconds: {ttl}\n" + MINIMAL))
    assert cfg.reconcile_timeout_seconds == expected < ttl / 2
    explicit = load_config(write(tmp_path, f"leaseTTLSeconds: {ttl}\nreconcileTimeoutSeconds: 0.5\n" + MINIMAL))
    assert explicit.reconcile_timeout_seconds == 0.5
    assert "min(3, 0.3 * leaseTTLSeconds)" in (REPO / "docs" / "configuration.md").read_text()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("-1", "Input should be greater than or equal to 0"),
        ("86401", "Input should be less than or equal to 86400"),
        ("'30'", "Input should be a valid number"),
    ],
)
def test_rejoin_grace_out_of_bounds_exits_2_naming_the_field(tmp_path: Path, value: str, problem: str) -> None:
    """`rejoinGraceSeconds` (issue 24) is checked like every field: `FILE: rejoinGraceSeconds: problem`, exit 2."""
    path = write(tmp_path, f"rejoinGraceSeconds: {value}\n" + MINIMAL)
    assert problems_of(path) == [f"{path}: rejoinGraceSeconds: {problem}"]
    result = CliRunner().invoke(app, ["controller-manager", "--config", str(path)])
    assert result.exit_code == 2, result.output
    assert f"{path}: rejoinGraceSeconds: {problem}" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("value", ["0", "0.5", "86400"])
def test_rejoin_grace_bounds_are_inclusive(tmp_path: Path, value: str) -> None:
    cfg = load_config(write(tmp_path, f"rejoinGraceSeconds: {value}\n" + MINIMAL))
    assert cfg.rejoin_grace_seconds == float(value)


def test_instance_prefix_help_says_it_is_the_stable_identity() -> None:
    result = CliRunner().invoke(app, ["controller-manager", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.replace("│", " ").split())
    for said in ("stable identity", "StatefulSet pod name", "rejoinGraceSeconds > 0", "default: host-pid-random"):
        assert said in text, text

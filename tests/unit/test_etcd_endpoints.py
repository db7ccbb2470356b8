"""The one etcd endpoint grammar: ``http(s)://HOST[:PORT]`` or a bare ``HOST:PORT`` (http), as etcdctl reads it.

Every command's ``--etcd``, ``$RANGESHARD_ETCD`` and the manager's ``etcd.endpoints`` use
:func:`rangeshard.core.etcd.parse_endpoint`; tests/registry/test_etcd_url.py runs each entry.
"""

from __future__ import annotations

import pytest

from rangeshard.core.errors import ConfigError
from rangeshard.core.etcd import ENV_ENDPOINTS, EtcdConfig, parse_endpoint, parse_endpoints


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("127.0.0.1:2379", "http://127.0.0.1:2379"),
        ("etcd-0.etcd:12379", "http://etcd-0.etcd:12379"),
        ("http://h", "http://h:2379"),
        ("https://h", "https://h:2379"),
        ("https://H.example:443/", "https://h.example:443"),
        ("  http://h:1 ", "http://h:1"),
        ("[::1]:2379", "http://[::1]:2379"),
        ("https://[fe80::1]", "https://[fe80::1]:2379"),
    ],
)
def test_accepted_spellings(text: str, url: str) -> None:
    assert parse_endpoint(text).url == url


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("foo", "not a valid URL"),
        ("ftp://h:1", "scheme must be http or https"),
        ("http://h:99999", "invalid URL"),
        ("h:0", "port must be 1-65535"),
        ("http://:1", "no host"),
        ("http://h:1/v3", "expected scheme://host:port and nothing else"),
        ("http://h:1?x=1", "expected scheme://host:port and nothing else"),
        ("http://h:1#x", "expected scheme://host:port and nothing else"),
        ("http://h 1:2", "a URL is one word with no spaces"),
        ("", "a URL is one word with no spaces"),
    ],
)
def test_refused_spellings_name_the_value(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_endpoint(text)
    assert str(info.value).startswith(f"etcd endpoint {text!r}: {problem}")
    assert "want http(s)://HOST[:PORT] or HOST:PORT" in str(info.value)


@pytest.mark.parametrize("text", ["http://root:s3cret@h:2379", "root:s3cret@h:2379"])
def test_credentials_are_refused_and_never_repeated(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_endpoint(text)
    assert "s3cret" not in str(info.value) and "***@h:2379" in str(info.value)
    assert "credentials do not belong in the URL" in str(info.value)


def test_a_list_reports_every_bad_endpoint() -> None:
    assert [e.url for e in parse_endpoints(" a:1 ,, https://b ,")] == ["http://a:1", "https://b:2379"]
    with pytest.raises(ConfigError) as info:
        parse_endpoints("a:1,foo,ftp://c:3")
    assert len(info.value.problems) == 2
    assert "'foo'" in info.value.problems[0] and "'ftp://c:3'" in info.value.problems[1]
    with pytest.raises(ConfigError, match="no endpoint"):
        parse_endpoints(" , ")


def test_config_falls_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_ENDPOINTS, "e1:2379,https://e2")
    assert EtcdConfig.from_urls(None).urls == "http://e1:2379,https://e2:2379"
    monkeypatch.delenv(ENV_ENDPOINTS)
    assert EtcdConfig.from_urls("").urls == "http://127.0.0.1:2379"

"""Configuration edges of the security options: token files, auth modes, upstream CA, TTL cache (no processes)."""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import pytest

from range_filter_proxy.auth import AuthMode, AuthSettings, ProxyAuth, TtlCache
from range_filter_proxy.upstream import load_upstream_config
from rangeshard.core.errors import ConfigError
from rangeshard.core.kubeapi import parse_token_file
from tests.security.certs import Pki


def test_token_file_format() -> None:
    """One parser (rangeshard.core.kubeapi) serves the proxy's --token-file and the local API server's."""
    text = '# comment\n\nt1,alice,u1,"system:masters,team"\nt2,bob,u2\n'
    users = parse_token_file(text)
    assert {u.username: u.groups for u in users.values()} == {
        "alice": ("system:masters", "team", "system:authenticated"),
        "bob": ("system:authenticated",),
    }
    assert "t1" not in repr(users)  # keyed by digest, never the token
    for bad in ("t1,alice\n", "t1,alice,u\nt1,bob,u\n", ",alice,u\n", "# only comments\n"):
        with pytest.raises(ConfigError) as err:
            parse_token_file(bad)
        assert "t1," not in str(err.value)


def test_proxy_auth_settings_are_checked() -> None:
    with pytest.raises(ConfigError):
        ProxyAuth(AuthSettings(mode=AuthMode.STATIC))
    with pytest.raises(ConfigError):
        ProxyAuth(AuthSettings(mode=AuthMode.DELEGATE))  # no upstream to review with
    with pytest.raises(ConfigError):
        ProxyAuth(AuthSettings(mode=AuthMode.NONE, users=parse_token_file("t,u,i\n")))
    with pytest.raises(ConfigError):
        ProxyAuth(AuthSettings(cache_size=0))


def test_upstream_ca(pki: Pki) -> None:
    config = load_upstream_config("https://127.0.0.1:1", upstream_ca=str(pki.ca_cert))
    assert isinstance(config.verify, ssl.SSLContext)
    with pytest.raises(ConfigError):
        load_upstream_config("http://127.0.0.1:1", upstream_ca=str(pki.ca_cert))
    with pytest.raises(ConfigError):
        load_upstream_config("https://127.0.0.1:1", upstream_ca=str(Path(pki.ca_cert).with_name("missing.pem")))


def test_ttl_cache_is_bounded_and_expires() -> None:
    cache: TtlCache[str, int] = TtlCache(ttl=0.05, max_entries=3)
    for i in range(5):
        cache.put(str(i), i)
    assert len(cache) == 3 and cache.get("0") == (False, None) and cache.get("4") == (True, 4)
    deadline = time.monotonic() + 5
    while cache.get("4")[0]:
        assert time.monotonic() < deadline
        time.sleep(0.01)

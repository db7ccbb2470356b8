"""The one bearer token file reader: read at start, re-read when rotated, never emptied, used by both paths.

The in-process controllers' official client and the external endpoint read
``proxy.tokenFile`` through :class:`rangeshard.core.tokenfile.BearerTokenFile`.
The endpoint used to re-read the file on every request and send no token
(a 401 and a WARNING per request) while it was unreadable; now both keep the
last good token, and an unreadable file at start is a config error for both.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from controller_manager.config import ExternalSection
from controller_manager.external import Endpoint
from controller_manager.fencing import api_client_for
from rangeshard.core.errors import ConfigError
from rangeshard.core.tokenfile import BearerTokenFile


def _rotate(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, (st.st_atime, st.st_mtime + 10))  # the kubelet swaps the file: a new mtime


def test_token_is_reread_after_rotation_and_the_last_good_one_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    source = BearerTokenFile(str(path))
    assert source.token == "first" and source.authorization() == "Bearer first"
    _rotate(path, "second\n")
    assert source.token == "second"
    path.unlink()
    with caplog.at_level(logging.WARNING):
        assert [source.token for _ in range(3)] == ["second"] * 3, "unreadable for a moment: keep the last good token"
    assert len([r for r in caplog.records if "keeping the previous token" in r.message]) == 1, "one WARNING"
    _rotate(path, "  \n")
    assert source.token == "second", "an empty file is no token either"
    _rotate(path, "third")
    assert source.token == "third"


def test_bad_token_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        BearerTokenFile(str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    with pytest.raises(ConfigError, match="is empty"):
        BearerTokenFile(str(empty))
    section = ExternalSection.model_validate({"shard": [{"resource": "configmaps", "by": "uid"}]})
    with pytest.raises(ConfigError, match=r"proxy\.tokenFile: cannot read"):
        Endpoint("ext", section, None, proxy_url="http://127.0.0.1:9", token_file=str(tmp_path / "missing"))  # type: ignore[arg-type]


def test_api_client_sends_the_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("abc")
    client = api_client_for("http://127.0.0.1:1", str(path))
    try:
        assert client.configuration.get_api_key_with_prefix("BearerToken") == "Bearer abc"
        _rotate(path, "def")
        assert client.configuration.get_api_key_with_prefix("BearerToken") == "Bearer def"
    finally:
        client.close()

"""The manager's bearer token file: read at start, re-read when rotated, never emptied."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from controller_manager.manager import TokenFile, api_client_for
from rangeshard.core.errors import ConfigError


def test_token_is_reread_after_rotation(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    source = TokenFile(str(path))
    cfg = SimpleNamespace(api_key={})
    source(cfg)
    assert cfg.api_key == {"BearerToken": "first"}
    path.write_text("second\n")
    st = path.stat()
    os.utime(path, (st.st_atime, st.st_mtime + 10))  # the kubelet swaps the file: a new mtime
    source(cfg)
    assert cfg.api_key == {"BearerToken": "second"}
    path.unlink()
    source(cfg)  # unreadable for a moment: keep the last good token
    assert cfg.api_key == {"BearerToken": "second"}


def test_bad_token_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        TokenFile(str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    with pytest.raises(ConfigError, match="is empty"):
        TokenFile(str(empty))


def test_api_client_sends_the_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("abc")
    client = api_client_for("http://127.0.0.1:1", str(path))
    try:
        assert client.configuration.get_api_key_with_prefix("BearerToken") == "Bearer abc"
    finally:
        client.close()

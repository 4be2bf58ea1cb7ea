"""Encrypted JSON keystores (eth-account V3, as geth and clef write) beside raw key files."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from eth_account import Account

from protocol.agents_cli import read_key_file

KEY = "0x" + "11" * 32


def _keystore(tmp_path: Path, password: str) -> Path:
    ks = Account.encrypt(KEY, password, kdf="pbkdf2", iterations=1024)  # a cheap KDF keeps the test fast
    p = tmp_path / "key.json"
    p.write_text(json.dumps(ks))
    return p


def test_a_keystore_opens_with_its_password_from_the_environment(tmp_path: Path, monkeypatch) -> None:
    p = _keystore(tmp_path, "correct horse")
    monkeypatch.setenv("VTRAIN_KEY_PASSWORD", "correct horse")
    assert read_key_file(p).address == Account.from_key(KEY).address


def test_a_keystore_opens_with_a_password_file(tmp_path: Path, monkeypatch) -> None:
    p = _keystore(tmp_path, "s3cret")
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    monkeypatch.delenv("VTRAIN_KEY_PASSWORD", raising=False)
    monkeypatch.setenv("VTRAIN_KEY_PASSWORD_FILE", str(pw))
    assert read_key_file(p).address == Account.from_key(KEY).address


@pytest.mark.parametrize(
    "setup, words",
    [
        ("wrong", "wrong keystore password"),
        ("none", "set $VTRAIN_KEY_PASSWORD_FILE or $VTRAIN_KEY_PASSWORD"),
        ("notjson", "not JSON"),
        ("nocrypto", "needs a 'crypto' section"),
        ("missingfile", "No such file"),
    ],
)
def test_bad_keystores_are_refused_naming_the_problem(tmp_path: Path, monkeypatch, setup: str, words: str) -> None:
    p = _keystore(tmp_path, "right")
    monkeypatch.delenv("VTRAIN_KEY_PASSWORD", raising=False)
    monkeypatch.delenv("VTRAIN_KEY_PASSWORD_FILE", raising=False)
    if setup == "wrong":
        monkeypatch.setenv("VTRAIN_KEY_PASSWORD", "wrong")
    elif setup == "notjson":
        p.write_text("{not json")
    elif setup == "nocrypto":
        p.write_text(json.dumps({"address": "00" * 20, "version": 3}))
    elif setup == "missingfile":
        monkeypatch.setenv("VTRAIN_KEY_PASSWORD_FILE", str(tmp_path / "nope"))
    with pytest.raises(click.ClickException) as e:
        read_key_file(p)
    assert words in e.value.message and KEY[2:] not in e.value.message

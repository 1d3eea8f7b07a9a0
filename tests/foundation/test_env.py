from __future__ import annotations

from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from gpusweep import env


def test_it_reads_booleans_and_rejects_nonsense(monkeypatch):
    monkeypatch.setenv("X_FLAG", "yes")
    assert env.env_bool("X_FLAG", False) is True
    monkeypatch.setenv("X_FLAG", "off")
    assert env.env_bool("X_FLAG", True) is False
    monkeypatch.setenv("X_FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="X_FLAG='maybe' is not a boolean"):
        env.env_bool("X_FLAG", True)


def test_it_rejects_bad_integers_and_values_below_minimum(monkeypatch):
    monkeypatch.setenv("X_NUM", "12a")
    with pytest.raises(ImproperlyConfigured, match="not an integer"):
        env.env_int("X_NUM", 1)
    monkeypatch.setenv("X_NUM", "-1")
    with pytest.raises(ImproperlyConfigured, match="at least 0"):
        env.env_int("X_NUM", 1, minimum=0)


def test_it_rejects_unknown_url_schemes(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "mysql://root@localhost/x")
    with pytest.raises(ImproperlyConfigured, match="scheme 'mysql'"):
        env.env_url("DATABASE_URL", "sqlite:///x", schemes={"sqlite", "postgres"})


def test_it_generates_a_secret_key_once_in_debug(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("SECRET_KEY", raising=False)
    first = env.secret_key(tmp_path, debug=True)
    assert len(first) >= 50
    assert env.secret_key(tmp_path, debug=True) == first
    assert (tmp_path / "secret_key").stat().st_mode & 0o077 == 0


def test_it_requires_a_secret_key_when_debug_is_off(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("SECRET_KEY", raising=False)
    with pytest.raises(ImproperlyConfigured, match="SECRET_KEY must be set"):
        env.secret_key(tmp_path, debug=False)
    monkeypatch.setenv("SECRET_KEY", "short")
    with pytest.raises(ImproperlyConfigured, match="at least 32"):
        env.secret_key(tmp_path, debug=False)

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


RACE = """
import sys, time
from pathlib import Path
from gpusweep import env
start = float(sys.argv[2])
while time.time() < start:
    pass
print(env.write_once(Path(sys.argv[1]), env.secrets.token_urlsafe(4000).encode()).decode())
"""


def test_processes_starting_together_all_read_one_whole_value(tmp_path: Path):
    """Web and workers started at once each generate a key (SECRET_KEY, the evidence signing key):
    they must all end with the same, complete value; a reader once got an empty or half-written file
    (the evidence key then failed with "An Ed25519 private key is 32 bytes long")."""
    import subprocess
    import sys
    import time

    path = tmp_path / "var" / "key"
    for _round in range(3):
        path.unlink(missing_ok=True)
        start = time.time() + 1.5  # every process is started and spinning by then
        procs = [subprocess.Popen([sys.executable, "-c", RACE, str(path), str(start)], stdout=subprocess.PIPE,
                                  text=True) for _ in range(8)]
        values = {proc.communicate(timeout=30)[0].strip() for proc in procs}
        assert all(proc.returncode == 0 for proc in procs)
        assert values == {path.read_text()} and len(path.read_text()) > 5000
        assert path.stat().st_mode & 0o077 == 0
        assert [p.name for p in path.parent.iterdir()] == ["key"]  # no temporary file left

"""The demo fleet's parts that run outside Django (its counter workload) and what scripts read of it."""

from __future__ import annotations


def printed_logins(output: str) -> dict[str, str]:
    """username -> password from what `manage.py ensure_demo_admin` prints ("username: X  password: Y")."""
    found = {}
    for line in output.splitlines():
        parts = line.split()
        if parts[:1] == ["username:"] and "password:" in parts:
            found[parts[1]] = parts[parts.index("password:") + 1]
    return found

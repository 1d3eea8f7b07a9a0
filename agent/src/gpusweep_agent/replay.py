"""The nonces the agent accepted, remembered while their requests could still pass the clock check.

A signed request is accepted for MAX_SKEW_SECONDS either side of its timestamp, so its nonce is
kept until ``timestamp + MAX_SKEW_SECONDS``; a request reusing a kept nonce is a replay (401).
The set survives a restart of the agent (a reboot restarts it within seconds): each accepted
nonce is appended to ``<state_dir>/nonces.log``, which is read back at start and rewritten
without the expired entries once it has grown. Appends are flushed, not fsynced: a crash of the
machine forgets the last few, a crash of the process none.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from .auth import MAX_SKEW_SECONDS, Signed

COMPACT_EVERY = 10_000  # lines appended between rewrites of the log


class ReplayError(Exception):
    """The nonce was accepted before: a replayed request."""


class NonceLog:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        # Nonce -> until when it is kept. Only requests signed for this node get here.
        self._seen: dict[str, float] = {}
        self._appended = 0
        if path is not None and path.exists():
            self._load(path)

    def _load(self, path: Path) -> None:
        now = time.time()
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            parts = line.split(" ")
            if len(parts) != 2:
                continue  # a line cut short by a crash
            try:
                expires = float(parts[0])
            except ValueError:
                continue
            if expires >= now:
                self._seen[parts[1]] = expires
        self._rewrite()

    def claim(self, signed: Signed, now: float | None = None) -> None:
        """Remember the request's nonce, or raise ReplayError if it was seen before."""
        current = now if now is not None else time.time()
        key = signed.nonce
        expires = float(signed.timestamp + MAX_SKEW_SECONDS + 1)
        with self._lock:
            known = self._seen.get(key)
            if known is not None and known >= current:
                raise ReplayError(f"replayed request (nonce {signed.nonce} was used before)")
            self._seen[key] = expires
            self._append(key, expires)
            if self._appended >= COMPACT_EVERY:
                self._seen = {k: v for k, v in self._seen.items() if v >= current}
                self._rewrite()

    def _append(self, key: str, expires: float) -> None:
        if self.path is None:
            return
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(f"{expires:.0f} {key}\n")
        self._appended += 1

    def _rewrite(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(f"{v:.0f} {k}\n" for k, v in self._seen.items()), encoding="utf-8")
        os.replace(tmp, self.path)
        self._appended = 0

"""Django for a benchmark script: one bootstrap and one corpus lookup for every bench."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def boot(database_url: str, prefix: str = "gpusweep-bench-") -> tempfile.TemporaryDirectory[str]:
    """Set Django up from the environment with a temporary var/ folder, and a temporary SQLite
    file where no database URL is given. Keep the returned folder alive while the bench runs."""
    tmp = tempfile.TemporaryDirectory(prefix=prefix)
    os.environ["DATABASE_URL"] = database_url or f"sqlite:///{tmp.name}/bench.sqlite3"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpusweep.settings")
    os.environ.setdefault("GPUSWEEP_VAR_DIR", tmp.name)
    import django

    django.setup()
    return tmp


def corpus_folder(given: str) -> Path | None:
    """The CSAF folder to ingest: `given`, else the shared nvidia-csaf mirror; None (said why) if absent."""
    from django.conf import settings

    corpus = Path(given or Path(settings.GPUSWEEP_SHARED_DATA_DIR) / "nvidia-csaf")
    if corpus.is_dir():
        return corpus
    print(f"no CSAF corpus at {corpus}: pass --corpus or set GPUSWEEP_SHARED_DATA_DIR", file=sys.stderr)
    return None

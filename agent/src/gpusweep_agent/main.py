from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("gpusweep-agent: not yet implemented", file=sys.stderr)
    return 2

"""CVSS v3.x base scores computed from their vectors (FIRST's specification, section 7.1).

Bulletins sometimes publish a base score that does not match their own vector (NVIDIA's 5703:
7.1 for a vector that computes to 7.8); a CSAF document must carry the vector's score (CSAF 2.0
mandatory test 6.1.9), so the VEX writes the computed one.
"""

from __future__ import annotations

import math
import re

_WEIGHTS: dict[str, dict[str, float]] = {
    "AV": {"N": 0.85, "A": 0.62, "L": 0.55, "P": 0.2},
    "AC": {"L": 0.77, "H": 0.44},
    "UI": {"N": 0.85, "R": 0.62},
    "C": {"H": 0.56, "L": 0.22, "N": 0.0},
    "I": {"H": 0.56, "L": 0.22, "N": 0.0},
    "A": {"H": 0.56, "L": 0.22, "N": 0.0},
}
# Privileges Required weighs more when the scope changes.
_PR = {"U": {"N": 0.85, "L": 0.62, "H": 0.27}, "C": {"N": 0.85, "L": 0.68, "H": 0.5}}
_VECTOR = re.compile(r"CVSS:3\.[01](?:/[A-Z]+:[A-Z])+")


def _roundup(value: float) -> float:
    """CVSS 3.1's Roundup: the smallest one-decimal number >= value, free of float noise."""
    whole = round(value * 100000)
    return whole / 100000.0 if whole % 10000 == 0 else (math.floor(whole / 10000) + 1) / 10.0


def base_score(vector: str) -> float | None:
    """The base score of a CVSS v3.0/v3.1 vector; None when it is not one."""
    if not _VECTOR.fullmatch(vector):
        return None
    metrics = dict(part.split(":") for part in vector.split("/")[1:])
    try:
        scope = metrics["S"]
        w = {name: table[metrics[name]] for name, table in _WEIGHTS.items()}
        pr = _PR[scope][metrics["PR"]]
    except KeyError:
        return None
    iss = 1 - (1 - w["C"]) * (1 - w["I"]) * (1 - w["A"])
    impact = 6.42 * iss if scope == "U" else 7.52 * (iss - 0.029) - 3.25 * (iss - 0.02) ** 15
    exploitability = 8.22 * w["AV"] * w["AC"] * pr * w["UI"]
    if impact <= 0:
        return 0.0
    total = impact + exploitability if scope == "U" else 1.08 * (impact + exploitability)
    return _roundup(min(total, 10.0))


def severity(score: float) -> str:
    """CVSS v3's qualitative rating of a base score."""
    for floor, name in ((9.0, "CRITICAL"), (7.0, "HIGH"), (4.0, "MEDIUM"), (0.1, "LOW")):
        if score >= floor:
            return name
    return "NONE"

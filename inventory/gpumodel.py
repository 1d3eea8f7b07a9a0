"""GPU model names, read one way wherever two are compared: the simulator (a trace against a fleet)
and the inventory (one source's report against another's, inventory.owners).

A trace names GPU models by short codes (openb's `gpu_spec`: `T4`, `V100M32`, `P100`); a fleet by
what its node file or inventory says (`Tesla T4`, `Tesla V100-SXM2-32GB`, `NVIDIA A10`, what a
node reports or a mapping fills in). Both are reduced by `model_key` to the same key: the model
number (the first word with a digit: T4, V100, A100, H100, G2) and, when the name gives it, the
memory in GB (a `32GB` word, or openb's `M32` suffix), written `V100M32`. Vendor and product-line
words (NVIDIA, Tesla, RTX, PCIe, SXM2 ...) do not count. Two names are the same model when their
model numbers are equal and their memory sizes too, where both give one: `P100` is any P100, so
`Tesla P100-PCIE-16GB` (`P100M16`) is one; `V100M16` is not a `Tesla V100-SXM2-32GB`.
"""

from __future__ import annotations

import re
from functools import lru_cache

_OPENB_MEMORY = re.compile(r"^([A-Z]*\d+[A-Z]*?)M(\d+)$")  # V100M32: the V100 with 32 GB
_MEMORY_WORD = re.compile(r"^(\d+)(?:GB|G|GIB)$")  # 32GB, 80G
_NUMBER = re.compile(r"\d")
# Interface and form-factor words carry digits but name no model (Tesla V100-SXM2-32GB).
_FORM = re.compile(r"^(?:SXM\d*|PCIE\d*|HBM\d*E?|NVL\d*|GDDR\d*X?)$")


@lru_cache(maxsize=4096)
def model_key(name: str) -> str:
    """`Tesla V100-SXM2-32GB` -> `V100M32`, `V100M32` -> `V100M32`, `NVIDIA A10` -> `A10`, `` -> ``."""
    words = [w for w in re.split(r"[\s\-_/,()]+", name.strip().upper()) if w]
    number, memory = "", ""
    for word in words:
        sized = _MEMORY_WORD.match(word)
        if sized:
            memory = memory or str(int(sized.group(1)))
            continue
        if number or not _NUMBER.search(word) or _FORM.match(word):
            continue
        coded = _OPENB_MEMORY.match(word)
        number, memory = (coded.group(1), str(int(coded.group(2)))) if coded else (word, memory)
    if not number:  # no word with a digit: the name itself, tidied
        return "".join(words)
    return f"{number}M{memory}" if memory else number


def _parts(key: str) -> tuple[str, str]:
    coded = _OPENB_MEMORY.match(key)
    return (coded.group(1), coded.group(2)) if coded else (key, "")


@lru_cache(maxsize=4096)
def same_model(wanted: str, model: str) -> bool:
    """Is `model` (a node's GPU) the model `wanted` (a task's spec) names? Either as written anywhere."""
    a, b = model_key(wanted), model_key(model)
    if a == b:
        return True
    (number_a, memory_a), (number_b, memory_b) = _parts(a), _parts(b)
    return number_a == number_b != "" and not (memory_a and memory_b)

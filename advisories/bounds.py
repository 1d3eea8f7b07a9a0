"""Bounds on one CSAF document before it is parsed (issue 28 item 7).

A document nested 100,000 levels deep made ``json.loads`` raise RecursionError, which is no
DocumentError, so it aborted the whole ingest run and the valid bulletins beside it were lost. The
check walks the bytes once, without recursion, so a bad document is refused as a DocumentError and
the run goes on.
"""

from __future__ import annotations

from advisories.csaf import DocumentError

MAX_DEPTH = 64  # real CSAF documents nest about a dozen levels (product_tree branches included)
MAX_BYTES = 20 * 1024 * 1024  # per document; a feed's whole download is bounded separately


def check(content: bytes, document: str, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES) -> None:
    """Raise DocumentError when `content` is larger than `max_bytes` or nests deeper than `max_depth`."""
    if len(content) > max_bytes:
        raise DocumentError(document, f"{len(content)} bytes is more than the {max_bytes} allowed per document")
    depth, in_string, escaped = 0, False, False
    for byte in content:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x7B, 0x5B):  # { [
            depth += 1
            if depth > max_depth:
                raise DocumentError(document, f"nested more than {max_depth} levels deep")
        elif byte in (0x7D, 0x5D):  # } ]
            depth -= 1

"""Check an exported campaign's evidence without the service: standard library plus `cryptography`.

    python -m campaigns.verify campaign-12-evidence.json --public-key evidence-key.pub

An auditor gets the public key from the security team out of band (never only from the export),
and this file needs no database and no Django: it can be copied and run anywhere.

What an export holds (format "gpusweep-evidence/2"):
- the campaign's own chain of campaign-level events and one chain per node sweep; in each,
  ``hash = sha256(prev_hash + canonical JSON of the event body)``, numbered from 1;
- the recorded head (last number and hash) of every chain;
- seals: Ed25519 signatures over the campaign head together with every node head and their
  Merkle root (made when the campaign completes, when it is asked, and at export), and each
  finished node sweep's signed head.

Detected: an event edited (its hash), removed (a gap, or a chain ending before its head),
reordered or inserted (numbers and links), and a whole chain rewritten with recomputed hashes
(its heads no longer match what was signed before, and nobody without the key can sign again).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import itertools
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

FORMAT = "gpusweep-evidence/2"


def canonical(payload: Any) -> str:
    """The bytes that are hashed and signed: sorted keys, no spaces, non-ASCII kept."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def chain_hash(prev: str, body: dict[str, Any]) -> str:
    return hashlib.sha256((prev + canonical(body)).encode()).hexdigest()


def event_body(campaign: int, sweep: int | None, seq: int, kind: str, actor: str, at: str,
               data: dict[str, Any]) -> dict[str, Any]:
    """What an event's hash covers: its chain (campaign, and sweep for a node event) and place in it."""
    return {"campaign": campaign, "sweep": sweep, "seq": seq, "kind": kind, "actor": actor, "at": at,
            "data": data}


def merkle_root(heads: Iterable[Sequence[Any]]) -> str:
    """Root over (sweep id, last number, head) per node chain, in sweep order ("" for none)."""
    level = [hashlib.sha256(f"leaf:{int(s)}:{int(n)}:{h}".encode()).hexdigest()
             for s, n, h in sorted(heads, key=lambda row: int(row[0]))]
    if not level:
        return ""
    while len(level) > 1:
        paired = []
        for index in range(0, len(level), 2):
            pair = level[index:index + 2]
            # An odd node is carried up unchanged.
            paired.append(hashlib.sha256(f"node:{pair[0]}:{pair[1]}".encode()).hexdigest() if len(pair) == 2
                          else pair[0])
        level = paired
    return level[0]


def seal_message(body: dict[str, Any]) -> bytes:
    return canonical(body).encode()


def node_head_body(campaign: int, sweep: int, seq: int, head: str) -> dict[str, Any]:
    """What a finished node sweep's signature covers."""
    return {"format": FORMAT, "campaign": campaign, "sweep": sweep, "seq": seq, "head": head}


def key_id(public_key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def load_public_key(text: str | bytes) -> Any:
    """An Ed25519 public key from PEM, or from the base64 of its 32 raw bytes."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    data = text.encode() if isinstance(text, str) else text
    if b"BEGIN" in data:
        key = serialization.load_pem_public_key(data)
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("the public key is not an Ed25519 key")
        return key
    raw = base64.b64decode(data.strip(), validate=True)
    return Ed25519PublicKey.from_public_bytes(raw)


def _signature_ok(public_key: Any, signature: str, message: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        public_key.verify(base64.b64decode(signature), message)
    except (InvalidSignature, ValueError):
        return False
    return True


def _chains(export: dict[str, Any], problems: list[str]) -> dict[int | None, dict[int, dict[str, Any]]]:
    """Events per chain (None = the campaign's), keyed by number, checked link by link."""
    campaign_id = int(export["campaign"]["id"])
    by_chain: dict[int | None, list[dict[str, Any]]] = defaultdict(list)
    for event in export.get("events", []):
        by_chain[event.get("sweep")].append(event)
    checked: dict[int | None, dict[int, dict[str, Any]]] = {}
    for chain, events in by_chain.items():
        name = "campaign chain" if chain is None else f"node sweep {chain}"
        events.sort(key=lambda e: int(e.get("seq") or 0))
        numbered: dict[int, dict[str, Any]] = {}
        prev, expected = "", 1
        for event in events:
            seq = int(event.get("seq") or 0)
            if seq in numbered:
                problems.append(f"{name}: event #{seq} appears twice (inserted)")
                continue
            if seq != expected:
                problems.append(f"{name}: expected event #{expected}, found #{seq} (events removed or reordered)")
            body = event_body(campaign_id, chain, seq, event["kind"], event["actor"], event["at"], event["data"])
            if event.get("prev_hash", "") != prev:
                problems.append(f"{name}: event #{seq} does not link to the event before it (inserted or reordered)")
            if chain_hash(event.get("prev_hash", ""), body) != event.get("hash"):
                problems.append(f"{name}: event #{seq} ({event['kind']}) was edited: its hash does not match")
            numbered[seq] = event
            prev, expected = str(event.get("hash", "")), seq + 1
        checked[chain] = numbered
    return checked


def _last(chain: dict[int, dict[str, Any]]) -> tuple[int, str]:
    if not chain:
        return 0, ""
    seq = max(chain)
    return seq, str(chain[seq].get("hash", ""))


def _head_at(chain: dict[int, dict[str, Any]], seq: int) -> str:
    return "" if seq == 0 else str((chain.get(seq) or {}).get("hash", "<missing>"))


def verify_export(export: dict[str, Any], public_key: Any) -> list[str]:
    """Every problem found in an export; an empty list means the evidence is intact and signed."""
    problems: list[str] = []
    if export.get("format") != FORMAT:
        return [f"not a {FORMAT} export (format {export.get('format')!r})"]
    campaign = export["campaign"]
    campaign_id = int(campaign["id"])
    expected_key = key_id(public_key)
    chains = _chains(export, problems)
    own = chains.get(None, {})
    # Recorded heads: removing the newest events is as visible as removing one in the middle.
    if _last(own) != (int(campaign.get("evidence_seq") or 0), str(campaign.get("evidence_head") or "")):
        problems.append(f"campaign chain ends at #{_last(own)[0]} but the campaign recorded "
                        f"#{campaign.get('evidence_seq')}: events removed at the end, or the head rewritten")
    sweeps = {int(s["id"]): s for s in export.get("sweeps", [])}
    for chain in chains:
        if chain is not None and chain not in sweeps:
            problems.append(f"events of node sweep {chain}, which the export does not list")
    for sweep_id, sweep in sweeps.items():
        mine = chains.get(sweep_id, {})
        if _last(mine) != (int(sweep.get("evidence_seq") or 0), str(sweep.get("evidence_head") or "")):
            problems.append(f"node sweep {sweep_id} ({sweep.get('node')}): its chain does not end where recorded")
        signed = sweep.get("signed_head")
        if signed:
            body = node_head_body(campaign_id, sweep_id, int(signed["seq"]), str(signed["head"]))
            if signed.get("key_id") != expected_key or not _signature_ok(public_key, signed["signature"],
                                                                          seal_message(body)):
                problems.append(f"node sweep {sweep_id}: the signature of its head is not valid for this key")
            elif _head_at(mine, int(signed["seq"])) != signed["head"]:
                problems.append(f"node sweep {sweep_id} ({sweep.get('node')}): its chain no longer matches its "
                                "signed head (rewritten)")
            if _last(mine)[0] != int(signed["seq"]):
                problems.append(f"node sweep {sweep_id} ({sweep.get('node')}): events after its signed end "
                                f"(#{signed['seq']}): inserted")
        elif sweep.get("finished"):
            problems.append(f"node sweep {sweep_id} finished but carries no signed head")
    seals = export.get("seals", [])
    if not seals:
        problems.append("no signed seal: the export cannot be checked against the service's key")
    for expected_number, seal in enumerate(sorted(seals, key=lambda s: int(s["number"])), start=1):
        body = seal["body"]
        label = f"seal {seal['number']} ({seal.get('reason')})"
        if int(seal["number"]) != expected_number:
            problems.append(f"expected seal {expected_number}, found {seal['number']} (a seal was removed)")
        if seal.get("key_id") != expected_key or not _signature_ok(public_key, seal["signature"],
                                                                    seal_message(body)):
            problems.append(f"{label}: signature not valid for this public key")
            continue
        if int(body.get("campaign", -1)) != campaign_id:
            problems.append(f"{label}: signed for campaign {body.get('campaign')}, not {campaign_id}")
        if _head_at(own, int(body["campaign_seq"])) != body["campaign_head"]:
            problems.append(f"{label}: the campaign chain no longer matches the head signed at "
                            f"#{body['campaign_seq']} (rewritten)")
        if merkle_root(body.get("nodes", [])) != body.get("root"):
            problems.append(f"{label}: its Merkle root does not match its node heads")
        for sweep_id, seq, head in body.get("nodes", []):
            if _head_at(chains.get(int(sweep_id), {}), int(seq)) != head:
                problems.append(f"{label}: node sweep {sweep_id} no longer matches the head signed at #{seq} "
                                "(rewritten)")
    # Once a campaign is complete nothing happens on its nodes: the completion seal has their last events.
    final = next((s for s in seals if s.get("reason") == "completed"), None)
    if final is not None:
        covered_at_end = {int(s): int(n) for s, n, _h in final["body"].get("nodes", [])}
        for chain_id, node_chain in chains.items():
            if chain_id is not None and _last(node_chain)[0] != covered_at_end.get(int(chain_id), -1):
                problems.append(f"node sweep {chain_id}: its chain changed after the campaign completed "
                                "(inserted or removed)")
    # Every "sealed" event of the campaign chain names a seal that must still be there.
    numbers = {int(s["number"]) for s in seals}
    for event in own.values():
        if event["kind"] == "sealed" and int(event["data"].get("seal", 0)) not in numbers:
            problems.append(f"campaign chain event #{event['seq']} records seal {event['data'].get('seal')}, "
                            "which the export lacks (removed)")
    if seals:
        newest_seal = max(seals, key=lambda s: int(s["number"]))
        newest = newest_seal["body"]
        covered = {int(s): int(n) for s, n, _h in newest.get("nodes", [])}
        signed_up_to = int(newest["campaign_seq"])
        after = own.get(signed_up_to + 1)
        if after is not None and after["kind"] == "sealed" and int(after["data"].get("seal", 0)) == int(
                newest_seal["number"]):
            signed_up_to += 1  # the event recording this very seal comes right after what it signed
        if signed_up_to != _last(own)[0] or any(
                _last(chain)[0] != covered.get(int(sweep_id), 0) for sweep_id, chain in chains.items()
                if sweep_id is not None):
            problems.append("events after the newest seal are not covered by a signature")
    return problems


# --- the digest store: each seal and signed node head also kept outside the database -----------------
# One JSON line per record, in a file per campaign (campaigns.digests writes them), chained as
# CloudTrail chains its digest files: ``digest = sha256(prev + canonical(entry))`` over the line's
# other fields. A database writer who rewrites a chain and has it signed again cannot make these
# older records match: they pin the heads as they were signed.


def digest_of(prev: str, entry: dict[str, Any]) -> str:
    fields = {k: v for k, v in entry.items() if k not in ("prev", "digest")}
    return hashlib.sha256((prev + canonical(fields)).encode()).hexdigest()


def digest_problems(digests: list[dict[str, Any]], intact: int = 0) -> list[str]:
    """Problems of the digest chain itself (a line edited, removed or inserted); the first `intact`
    entries are the very ones the caller already found without a problem (not hashed again)."""
    problems, prev = [], str(digests[intact - 1].get("digest", "")) if intact else ""
    for expected, entry in enumerate(itertools.islice(digests, intact, None), start=intact + 1):
        if int(entry.get("n", 0)) != expected or entry.get("prev", "") != prev:
            problems.append(f"digest #{entry.get('n')}: does not follow digest #{expected - 1} (store edited)")
        if digest_of(entry.get("prev", ""), entry) != entry.get("digest"):
            problems.append(f"digest #{entry.get('n')}: its hash does not match (store edited)")
        prev = str(entry.get("digest", ""))
    return problems


def pinned_heads(entry: dict[str, Any]) -> list[tuple[int | None, int, str]]:
    """The (chain, number, head) a digest record pins: None is the campaign's own chain."""
    record = entry["record"]
    if entry["kind"] == "node_head":
        return [(int(record["sweep"]), int(record["seq"]), str(record["head"]))]
    return [(None, int(record["campaign_seq"]), str(record["campaign_head"]))] + [
        (int(s), int(n), str(h)) for s, n, h in record.get("nodes", [])]


def check_digests(export: dict[str, Any], digests: list[dict[str, Any]], public_key: Any) -> list[str]:
    """Every way the export departs from the digests kept outside the database."""
    problems = digest_problems(digests)
    chains = _chains(export, [])
    # Seals signed for one answer and stored nowhere ("stored": false) have no digest, by design.
    stored = {int(s["number"]): s for s in export.get("seals", []) if s.get("stored", True)}
    digested_seals = set()
    for entry in digests:
        label = f"digest #{entry.get('n')} ({entry.get('kind')})"
        if not _signature_ok(public_key, str(entry.get("signature", "")), seal_message(entry["record"])):
            problems.append(f"{label}: signature not valid for this public key")
            continue
        for chain, seq, head in pinned_heads(entry):
            if _head_at(chains.get(chain, {}), seq) != head:
                name = "the campaign chain" if chain is None else f"node sweep {chain}"
                problems.append(f"{label}: {name} no longer has the head signed at #{seq} (rewritten or removed)")
        if entry["kind"] == "seal":
            number = int(entry["record"]["number"])
            digested_seals.add(number)
            if number not in stored or stored[number]["signature"] != entry["signature"]:
                problems.append(f"{label}: seal {number} is missing from the evidence or differs (removed or replaced)")
    for number in sorted(set(stored) - digested_seals):
        problems.append(f"seal {number} is in no digest: signed without the digest store")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m campaigns.verify", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export", type=Path, help="a campaign evidence export (JSON)")
    parser.add_argument("--public-key", required=True,
                        help="the service's Ed25519 public key: a PEM file, or its base64 text")
    parser.add_argument("--digests", type=Path, default=None,
                        help="the campaign's file from the digest store (campaign-ID.jsonl), fetched from the store")
    args = parser.parse_args(argv)
    try:
        export = json.loads(args.export.read_text(encoding="utf-8"))
        key_arg = Path(args.public_key)
        key_text = key_arg.read_bytes() if key_arg.exists() else args.public_key.encode()
        public_key = load_public_key(key_text)
        problems = verify_export(export, public_key)
        if args.digests is not None:
            lines = args.digests.read_text(encoding="utf-8").splitlines()
            problems += check_digests(export, [json.loads(line) for line in lines if line.strip()], public_key)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"cannot check {args.export}: {exc}", file=sys.stderr)
        return 2
    campaign = export.get("campaign", {})
    events = len(export.get("events", []))
    if problems:
        print(f"campaign {campaign.get('id')}: {len(problems)} problem(s) in {events} events")
        for problem in problems:
            print(f"  - {problem}")
        return 1
    print(f"campaign {campaign.get('id')} ({campaign.get('name')}): {events} events in "
          f"{1 + len(export.get('sweeps', []))} chains, {len(export.get('seals', []))} seal(s): intact and signed "
          f"by key {key_id(public_key)[:16]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

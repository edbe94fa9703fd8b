"""Offline verification catches each kind of tampering and names it (issue 6, invariant 9)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cosigner.audit.verify import Report, verify_export
from cosigner.core.canonical import canonicalize, hash_bytes
from tests.audit.conftest import jwks, records, seeded_export
from tests.conftest import Harness


def check(lines: list[str], keys: dict[str, Any]) -> Report:
    return verify_export(lambda: iter(lines), keys)


def event_index(lines: list[str], seq: int) -> int:
    return next(i for i, r in enumerate(records(lines))
                if r["kind"] == "event" and r["body"]["seq"] == seq)


def event_line(body: dict[str, Any], digest: str | None = None) -> str:
    digest = digest or hash_bytes(canonicalize(body))
    return json.dumps({"kind": "event", "hash": digest, "body": body}) + "\n"


@pytest.fixture
async def export(harness: Harness, tenant: str) -> tuple[list[str], dict[str, Any]]:
    lines = await seeded_export(harness, tenant)
    return lines, await jwks(harness)


Export = tuple[list[str], dict[str, Any]]


def test_untouched_export_verifies(export: Export) -> None:
    lines, keys = export
    report = check(lines, keys)
    assert report.ok, report
    kinds = [r["kind"] for r in records(lines)]
    assert report.events == kinds.count("event") and report.checkpoints >= 3
    assert report.first_seq == 1


def test_edited_event_is_caught(export: Export) -> None:
    lines, keys = export
    at = event_index(lines, 4)
    lines[at] = lines[at].replace('"effect":"deny"', '"effect":"allow"').replace(
        '"effect":"require_approval"', '"effect":"allow"').replace(
        '"effect":null', '"effect":"allow"')
    report = check(lines, keys)
    assert (report.ok, report.fault, report.bad_seq) == (False, "edited", 4)


@pytest.mark.parametrize("where", ["plain", "checkpointed"])
def test_edited_event_with_recomputed_hash_is_caught(export: Export, where: str) -> None:
    lines, keys = export
    seq = 5 if where == "plain" else checkpointed_seq(lines)
    at = event_index(lines, seq)
    body = records(lines)[at]["body"]
    body["payload"]["reasons"] = [{"code": "forged", "message": ""}]
    lines[at] = event_line(body)
    report = check(lines, keys)
    assert (report.fault, report.bad_seq) == ("edited", seq)


def test_deleted_event_is_caught(export: Export) -> None:
    lines, keys = export
    del lines[event_index(lines, 3)]
    report = check(lines, keys)
    assert (report.fault, report.bad_seq) == ("deleted", 3)


def checkpointed_seq(lines: list[str]) -> int:
    return int(next(r["seq"] for r in records(lines)[1:] if r["kind"] == "checkpoint"))


@pytest.mark.parametrize("where", ["plain", "checkpointed"])
def test_inserted_event_is_caught(export: Export, where: str) -> None:
    lines, keys = export
    seq = 6 if where == "plain" else checkpointed_seq(lines)
    at = event_index(lines, seq)
    forged = records(lines)[at]["body"]
    forged["effect"] = "allow"
    lines.insert(at, event_line(forged))  # a well-formed event claiming seq 6
    report = check(lines, keys)
    assert (report.fault, report.bad_seq) == ("inserted", seq)


def test_reordered_events_are_caught(export: Export) -> None:
    lines, keys = export
    a, b = event_index(lines, 4), event_index(lines, 5)
    lines[a], lines[b] = lines[b], lines[a]
    report = check(lines, keys)
    assert (report.fault, report.bad_seq) == ("reordered", 4)


def test_truncated_export_is_caught(export: Export) -> None:
    lines, keys = export
    last = max(r["body"]["seq"] for r in records(lines) if r["kind"] == "event")
    cut = [line for line in lines
           if not ('"kind":"event"' in line and json.loads(line)["body"]["seq"] > last - 2)]
    report = check(cut, keys)
    assert (report.fault, report.bad_seq) == ("truncated", last - 1)


def test_truncated_export_without_its_last_checkpoint_is_caught(export: Export) -> None:
    lines, keys = export
    report = check(lines[:event_index(lines, 2) + 1], keys)  # header still names last_seq
    assert (report.fault, report.bad_seq) == ("truncated", 3)


def test_swapped_checkpoint_signature_is_caught(export: Export) -> None:
    lines, keys = export
    cps = [i for i, r in enumerate(records(lines)) if r["kind"] == "checkpoint"]
    first, second = (json.loads(lines[i]) for i in cps[:2])
    h1, p1, s1 = first["token"].split(".")
    h2, p2, s2 = second["token"].split(".")
    first["token"], second["token"] = f"{h1}.{p1}.{s2}", f"{h2}.{p2}.{s1}"
    lines[cps[0]], lines[cps[1]] = json.dumps(first) + "\n", json.dumps(second) + "\n"
    report = check(lines, keys)
    assert (report.fault, report.bad_seq) == ("bad_checkpoint_signature", first["seq"])


def test_checkpoint_signed_by_unknown_key_is_caught(export: Export) -> None:
    lines, keys = export
    assert check(lines, keys).ok
    report = check(lines, {"keys": []})  # a JWKS without the signing key
    assert report.fault == "bad_checkpoint_signature" and "kid" in report.detail


def test_checkpoint_line_not_matching_its_signed_claims_is_caught(export: Export) -> None:
    lines, keys = export
    at = next(i for i, r in enumerate(records(lines)) if r["kind"] == "checkpoint")
    cp = json.loads(lines[at])
    cp["hash"] = "sha256:" + "1" * 64
    lines[at] = json.dumps(cp) + "\n"
    assert check(lines, keys).fault == "bad_checkpoint_signature"


def test_unsigned_anchor_is_caught(export: Export) -> None:
    lines, keys = export
    # Drop the first three events and pretend the export starts after them.
    header = json.loads(lines[0])
    fourth = records(lines)[event_index(lines, 4)]["body"]
    header["anchor"] = {"seq": 3, "hash": fourth["prev_hash"]}
    kept = [json.dumps(header) + "\n"] + [
        line for line in lines[1:] if not (
            '"kind":"event"' in line and json.loads(line)["body"]["seq"] <= 3)
        and not ('"kind":"checkpoint"' in line and json.loads(line)["seq"] <= 3)]
    report = check(kept, keys)
    assert (report.fault, report.bad_seq) == ("bad_anchor", 4)


def test_reformatted_lines_are_checked_by_canonical_form(export: Export) -> None:
    lines, keys = export
    at = event_index(lines, 3)
    record = records(lines)[at]
    lines[at] = json.dumps(record, indent=None, separators=(", ", ": ")) + "\n"
    assert check(lines, keys).ok  # same JSON, other spelling: still the same event
    record["body"]["effect"] = "forged"
    lines[at] = json.dumps(record, separators=(", ", ": ")) + "\n"
    assert (check(lines, keys).fault, check(lines, keys).bad_seq) == ("edited", 3)


@pytest.mark.parametrize(("own", "other"), [("Ed25519", "EdDSA"), ("EdDSA", "Ed25519")])
def test_K17_checkpoints_verify_offline_under_their_keys_own_alg(own: str, other: str) -> None:
    import base64
    from datetime import UTC, datetime

    from cosigner.audit.checkpoints import CHECKPOINT_TYP, sign_checkpoint
    from cosigner.audit.verify import ed25519_keys, verify_checkpoint_token
    from cosigner.keys.keyring import Keyring

    now = datetime.now(UTC)
    keyring = Keyring.ephemeral(now=now, alg=own)
    keys = ed25519_keys(keyring.jwks(now=now))
    checkpoint = sign_checkpoint(keyring, tenant="t", seq=1, hash_="sha256:" + "0" * 64,
                                 at=now)
    assert verify_checkpoint_token(checkpoint.token, keys)["seq"] == 1
    head, body, _ = checkpoint.token.split(".")
    renamed_head = base64.urlsafe_b64encode(json.dumps(
        {"alg": other, "kid": keyring.current_kid, "typ": CHECKPOINT_TYP}).encode()
    ).rstrip(b"=").decode()
    private = keyring._signing_key.private_key
    signature = base64.urlsafe_b64encode(private.sign(f"{renamed_head}.{body}".encode())
                                         ).rstrip(b"=").decode()
    with pytest.raises(ValueError, match="key's own"):
        verify_checkpoint_token(f"{renamed_head}.{body}.{signature}", keys)

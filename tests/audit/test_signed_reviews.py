"""``cosigner audit verify`` checks signed reviews against the keys registered earlier in
the same log (issue 22, the insider test): an export whose signed review was edited, or
whose registration event was removed, fails naming the seq even when every chain hash was
recomputed (and no checkpoint after it was kept to give the edit away)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cosigner.approvals import reviews
from cosigner.audit.verify import Report, verify_export
from cosigner.core.canonical import canonicalize, hash_bytes
from tests.approvals.signed import PUBLIC_URL, Scene, signed_bundle
from tests.audit.conftest import export_lines, jwks
from tests.conftest import ROOT

Export = tuple[list[dict[str, Any]], dict[str, Any]]


@pytest.fixture
async def export(harness_factory: Any, tenant: str, tmp_path: Path) -> Export:
    """A log with two passkey registrations and two signed approvals of one request."""
    bundles = signed_bundle(tmp_path, tenant, require="[{'role': 'finance', 'count': 2}]")
    h = await harness_factory(public_url=PUBLIC_URL, bundle_dirs=[bundles])
    scene = await Scene(h, tenant).start()
    fiona, gus = await scene.person("fiona", "finance"), await scene.person("gus", "finance")
    keys = {fiona: await scene.register(fiona), gus: await scene.register(gus)}
    approval_id = await scene.decide()
    for caller, key in keys.items():
        await reviews.review(h.context, caller, approval_id, decision="approved",
                             assertion=await scene.sign(caller, key, approval_id))
    auditor = await h.headers(tenant, "auditor")
    lines = await export_lines(h, auditor)
    return [json.loads(line) for line in lines], await jwks(h)


def rechained(records: list[dict[str, Any]]) -> list[str]:
    """The insider's export: checkpoints dropped, seqs renumbered, every hash recomputed."""
    out, prev, seq = [], None, 0
    header = records[0]
    for record in records[1:]:
        if record["kind"] != "event":
            continue
        body = record["body"]
        prev = prev or header["anchor"]["hash"]
        seq += 1
        body.update(seq=seq, prev_hash=prev)
        prev = hash_bytes(canonicalize(body))
        out.append(json.dumps({"kind": "event", "hash": prev, "body": body}) + "\n")
    header = {**header, "last_seq": seq}
    return [json.dumps(header) + "\n", *out]


def check(lines: list[str], keys: dict[str, Any]) -> Report:
    return verify_export(lambda: iter(lines), keys)


def signed_reviews(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["body"] for r in records if r["kind"] == "event"
            and r["body"]["type"] == "approval.reviewed" and r["body"]["payload"].get("signature")]


def test_untouched_and_rechained_exports_verify(export: Export) -> None:
    records, keys = export
    assert len(signed_reviews(records)) == 2
    lines = rechained(records)
    assert check(lines, keys).ok  # recomputing alone changes nothing


def test_edited_statement_is_caught_even_rechained(export: Export) -> None:
    records, keys = export
    review = signed_reviews(records)[0]
    # The insider makes the review say other arguments were approved, statement included.
    forged = "sha256:" + "ab" * 32
    review["args_hash"] = forged
    review["payload"]["signature"]["statement"]["args_hash"] = forged
    lines = rechained(records)
    report = check(lines, keys)
    assert (report.fault, report.bad_seq) == ("bad_approver_signature", review["seq"])


def test_statement_not_matching_the_event_is_caught(export: Export) -> None:
    records, keys = export
    review = signed_reviews(records)[1]
    review["payload"]["decision"] = "rejected"  # the signature said approve
    report = check(rechained(records), keys)
    assert (report.fault, report.bad_seq) == ("bad_approver_signature", review["seq"])


@pytest.mark.parametrize("member", ["signature", "authenticator_data", "client_data_json"])
def test_edited_assertion_is_caught_even_rechained(export: Export, member: str) -> None:
    records, keys = export
    review = signed_reviews(records)[1]
    signature = review["payload"]["signature"]
    raw = bytearray(base64.urlsafe_b64decode(signature[member] + "=="))
    raw[-5] ^= 0x01
    signature[member] = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    report = check(rechained(records), keys)
    assert (report.fault, report.bad_seq) == ("bad_approver_signature", review["seq"])


def test_removed_registration_is_caught_even_rechained(export: Export) -> None:
    records, keys = export
    first = next(i for i, r in enumerate(records) if r["kind"] == "event"
                 and r["body"]["type"] == "passkey.registered")
    del records[first]
    lines = rechained(records)
    review_seq = signed_reviews(records)[0]["seq"]  # renumbered by rechained()
    report = check(lines, keys)
    assert (report.fault, report.bad_seq) == ("unknown_credential", review_seq)


def test_dropped_signature_of_a_signed_requirement_is_caught(export: Export) -> None:
    records, keys = export
    review = signed_reviews(records)[0]
    del review["payload"]["signature"]
    report = check(rechained(records), keys)
    assert (report.fault, report.bad_seq) == ("missing_approver_signature", review["seq"])


def test_cli_names_the_fault_and_the_seq(export: Export, tmp_path: Path) -> None:
    records, keys = export
    review = signed_reviews(records)[0]
    review["payload"]["signature"]["statement"]["time"] = "2020-01-01T00:00:00.000000Z"
    (tmp_path / "export.jsonl").write_text("".join(rechained(records)))
    (tmp_path / "jwks.json").write_text(json.dumps(keys))
    done = subprocess.run([sys.executable, "-m", "cosigner", "audit", "verify",
                           str(tmp_path / "export.jsonl"), "--jwks", str(tmp_path / "jwks.json")],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith(f"FAULT bad_approver_signature at seq {review['seq']}:")


def approved_event(records: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r["body"] for r in records if r["kind"] == "event"
                and r["body"]["type"] == "approval.approved")


def test_deleted_signed_reviews_are_caught_at_the_approval(export: Export) -> None:
    records, keys = export
    # The insider deletes both signed reviews and keeps the approval (and its permit):
    # the approval.approved event names approvers of groups that ask for a signature.
    records[:] = [r for r in records if not (r["kind"] == "event" and r["body"]["type"]
                                             == "approval.reviewed")]
    lines = rechained(records)
    report = check(lines, keys)
    assert (report.fault, report.bad_seq) == ("missing_approver_signature",
                                              approved_event(records)["seq"])


def test_approval_of_other_arguments_than_were_signed_is_caught(export: Export) -> None:
    records, keys = export
    # The signed reviews stay intact; the approval (and the permit minted with it) now
    # names other arguments than the approvers signed.
    approved = approved_event(records)
    approved["args_hash"] = "sha256:" + "cd" * 32
    report = check(rechained(records), keys)
    assert (report.fault, report.bad_seq) == ("bad_approver_signature", approved["seq"])


def test_unsigned_approver_in_the_approval_is_caught(export: Export) -> None:
    records, keys = export
    approved = approved_event(records)
    del approved["payload"]["approvers"][0]["signature"]
    report = check(rechained(records), keys)
    assert (report.fault, report.bad_seq) == ("missing_approver_signature", approved["seq"])


def test_one_signed_approver_counted_twice_is_caught(export: Export) -> None:
    records, keys = export
    # count: 2 met by one person: the insider repeats fiona's signed entry in place of gus.
    approved = approved_event(records)
    approvers = approved["payload"]["approvers"]
    approvers[1] = {**approvers[0]}
    report = check(rechained(records), keys)
    assert (report.fault, report.bad_seq) == ("bad_approver_signature", approved["seq"])


def test_an_approver_moved_to_a_role_the_request_never_asked_is_caught(export: Export) -> None:
    records, keys = export
    # The insider strips fiona's signature and relabels her approval (review and approval)
    # as counted for a role outside the requirement, where no signature is asked.
    review = signed_reviews(records)[0]
    del review["payload"]["signature"]
    review["payload"]["role"] = "nobody"
    approved = approved_event(records)
    fiona = review["actor"]["subject"]
    entry = next(a for a in approved["payload"]["approvers"] if a["id"] == fiona)
    del entry["signature"]
    entry["role"] = "nobody"
    report = check(rechained(records), keys)
    assert (report.fault, report.bad_seq) == ("missing_approver_signature", approved["seq"])

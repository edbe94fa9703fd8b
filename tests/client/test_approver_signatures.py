"""The Python client's check of a permit's signed approvers against
``GET /v1/approvers/keys`` (issue 22): an executor need not trust the server's permit
signature alone for who approved these exact arguments."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from cosigner_client.approver_signatures import (
    ApproverSignatureError,
    verify_approver_signatures,
)

from cosigner.approvals import reviews
from tests.approvals.signed import PUBLIC_URL, Scene, signed_bundle


def claims_of(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


@pytest.fixture
async def signed_permit(harness_factory: Any, tenant: str, tmp_path: Path
                        ) -> tuple[dict[str, Any], dict[str, Any]]:
    bundles = signed_bundle(tmp_path, tenant, require="[{'role': 'finance', 'count': 1}]")
    h = await harness_factory(public_url=PUBLIC_URL, bundle_dirs=[bundles])
    scene = await Scene(h, tenant).start()
    fiona = await scene.person("fiona", "finance")
    key = await scene.register(fiona)
    approval_id = await scene.decide()
    await reviews.review(h.context, fiona, approval_id, decision="approved",
                         assertion=await scene.sign(fiona, key, approval_id))
    claims = claims_of((await scene.state(approval_id))["permit"]["token"])
    keys = (await h.client.get("/v1/approvers/keys", headers=scene.runtime)).json()
    return claims, keys


async def test_signed_approvers_verify(signed_permit: Any) -> None:
    claims, keys = signed_permit
    assert verify_approver_signatures(claims, keys, require=True) == ["fiona"]


@pytest.mark.parametrize("claim", ["args_hash", "tool", "approval_id"])
async def test_a_permit_for_other_arguments_does_not_verify(signed_permit: Any,
                                                            claim: str) -> None:
    claims, keys = signed_permit
    claims[claim] = claims[claim] + "x"
    with pytest.raises(ApproverSignatureError) as info:
        verify_approver_signatures(claims, keys)
    assert info.value.code == "bad_approver_signature"


async def test_another_persons_key_or_a_missing_key_is_unknown(signed_permit: Any) -> None:
    claims, keys = signed_permit
    claims["approvers"][0]["id"] = "mallory"  # the server's key could name anyone...
    with pytest.raises(ApproverSignatureError) as info:
        verify_approver_signatures(claims, keys)
    assert info.value.code == "unknown_credential"  # ...but not sign as them
    claims["approvers"][0]["id"] = "fiona"
    with pytest.raises(ApproverSignatureError) as info:
        verify_approver_signatures(claims, {**keys, "keys": []})
    assert info.value.code == "unknown_credential"


async def test_unsigned_approvers_fail_only_when_required(signed_permit: Any) -> None:
    claims, keys = signed_permit
    del claims["approvers"][0]["signature"]
    assert verify_approver_signatures(claims, keys) == []
    with pytest.raises(ApproverSignatureError) as info:
        verify_approver_signatures(claims, keys, require=True)
    assert info.value.code == "signature_missing"


async def test_required_signatures_refuse_a_permit_naming_no_approver(
        signed_permit: Any) -> None:
    claims, keys = signed_permit
    # Whoever holds the server's permit key can mint a permit with no approvers at all:
    # "every approver signed" must not be vacuously true.
    for approvers in ([], None):
        claims["approvers"] = approvers
        with pytest.raises(ApproverSignatureError) as info:
            verify_approver_signatures(claims, keys, require=True)
        assert info.value.code == "signature_missing"


async def test_one_person_named_twice_counts_once_at_most(signed_permit: Any) -> None:
    claims, keys = signed_permit
    # A minted permit repeating fiona's (valid) signed entry must not read as two approvers.
    claims["approvers"] = [claims["approvers"][0], dict(claims["approvers"][0])]
    with pytest.raises(ApproverSignatureError) as info:
        verify_approver_signatures(claims, keys, require=True)
    assert (info.value.code, info.value.approver) == ("bad_approver_signature", "fiona")


@pytest.mark.parametrize("shape", ["approvers-not-a-list", "entry-not-an-object",
                                   "signature-not-an-object"])
async def test_a_malformed_approvers_claim_fails_with_the_check_not_a_crash(
        signed_permit: Any, shape: str) -> None:
    claims, keys = signed_permit
    entry = dict(claims["approvers"][0])
    claims["approvers"] = {
        "approvers-not-a-list": {"0": entry},
        "entry-not-an-object": ["fiona"],
        "signature-not-an-object": [entry | {"signature": "c2lnbmF0dXJl"}],
    }[shape]
    with pytest.raises(ApproverSignatureError) as info:
        verify_approver_signatures(claims, keys, require=True)
    assert info.value.code == "bad_approver_signature"

"""A scene for signed-review tests: a tenant whose policy asks for passkey signatures, its
approvers (real local accounts) and their software authenticators."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from cosigner.core.review_statements import from_b64url
from cosigner.core.subjects import canonical_subject
from cosigner.identity import accounts, passkeys
from cosigner.identity.principals import PASSWORD_AUTHN, Caller
from tests.approvals.softkey import SoftAuthenticator
from tests.conftest import Harness, decision_request

PUBLIC_URL = "http://localhost:8080"
RP = passkeys.relying_party(PUBLIC_URL)


def signed_bundle(folder: Path, tenant: str, *, require: str, whole: bool = True) -> Path:
    """A Python-rule bundle for ``tenant``: every ``send_message`` needs ``require``
    (a Python literal list of groups), signed for the whole requirement when ``whole``."""
    bundle = folder / "bundles" / f"signed-{tenant}"
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / "manifest.toml").write_text(
        f'id = "signed-{tenant}"\nversion = "1.0.0"\nengine = "python"\n'
        f'entrypoint = "decide"\ntenants = ["{tenant}"]\n')
    signature = "'signature': 'webauthn', " if whole else ""
    (bundle / "rules.py").write_text(
        "def decide(input):\n"
        "    return {'effect': 'require_approval', 'reasons': ['signed_review'],\n"
        f"            'approval': {{{signature}'require': {require},\n"
        "                         'distinct_from': 'initiator_and_previous'}}\n")
    return folder / "bundles"


class Scene:
    def __init__(self, h: Harness, tenant: str) -> None:
        self.h, self.tenant = h, tenant
        self.runtime: dict[str, str] = {}

    async def start(self) -> Scene:
        self.runtime = await self.h.headers(self.tenant, "runtime", subject="agent-runtime")
        return self

    async def person(self, name: str, *roles: str) -> Caller:
        principal_id = await accounts.add_user(
            self.h.db, tenant=self.tenant, name=name, roles=list(roles),
            password="correct horse battery staple", clock=self.h.context.clock)
        return Caller(self.tenant, principal_id, canonical_subject(name), frozenset(roles),
                      "user", PASSWORD_AUTHN)

    async def register(self, caller: Caller) -> SoftAuthenticator:
        key = SoftAuthenticator(RP.id, RP.origin)
        ctx = self.h.context
        options = await passkeys.begin_registration(ctx.db, ctx.clock, caller, RP)
        await passkeys.finish_registration(ctx.db, ctx.clock, caller, RP, key.create(options))
        return key

    async def decide(self, **args: Any) -> str:
        body = decision_request(tool={"name": "send_message"},
                                args={"to": "c-42", "body": uuid.uuid4().hex, **args})
        resp = await self.h.client.post("/v1/decisions", headers=self.runtime, json=body)
        assert resp.status_code == 200, resp.text
        assert resp.json()["effect"] == "require_approval", resp.text
        return str(resp.json()["approval"]["id"])

    async def sign(self, caller: Caller, key: SoftAuthenticator, approval_id: str,
                   decision: str = "approved", **kw: Any) -> dict[str, Any]:
        from cosigner.approvals import signatures

        options = await signatures.begin(self.h.context, caller, approval_id,
                                         decision=decision)
        return key.get(from_b64url(options["publicKey"]["challenge"]), **kw)

    async def state(self, approval_id: str) -> dict[str, Any]:
        resp = await self.h.client.get(f"/v1/approvals/{approval_id}", headers=self.runtime)
        assert resp.status_code == 200, resp.text
        data: dict[str, Any] = resp.json()
        return data

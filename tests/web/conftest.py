"""Helpers for the approver web form tests (httpx and Playwright)."""

from __future__ import annotations

import re
from typing import Any

import httpx

from cosigner.core.clock import system_clock
from cosigner.db.database import Database
from cosigner.identity import accounts

PASSWORD = "correct horse battery staple"
_CSRF = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')


async def add_user(db: Database, tenant: str, name: str, *roles: str,
                   password: str = PASSWORD, clock: Any = system_clock) -> str:
    return await accounts.add_user(db, tenant=tenant, name=name, roles=list(roles),
                                   password=password, clock=clock)


def web_client(h: Any, base_url: str = "http://cosigner.test") -> httpx.AsyncClient:
    """A client of the harness app from its own random address, so sign-in throttling
    counters of one test never touch another's (tests share one PostgreSQL database).
    It sends ``Origin: base_url`` like a browser posting the server's own form."""
    import random

    address = f"10.{random.randrange(256)}.{random.randrange(256)}.{random.randrange(1, 255)}"
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=h.app, client=(address, 50000)),
                             base_url=base_url, headers={"Origin": base_url})


def csrf_of(html: str) -> str:
    match = _CSRF.search(html)
    assert match, "no csrf_token field in the page"
    return match.group(1)


async def sign_in(client: httpx.AsyncClient, tenant: str, name: str,
                  password: str = PASSWORD) -> httpx.Response:
    """GET the form, POST it; returns the POST response (303 on success)."""
    form = await client.get("/ui/login")
    return await client.post("/ui/login", data={
        "tenant": tenant, "name": name, "password": password,
        "csrf_token": csrf_of(form.text), "next": "/ui"})


def refund_request(amount_minor: int = 150_000, **args: Any) -> dict[str, Any]:
    """A refund that the reference policy sends to one finance approver."""
    from tests.conftest import decision_request

    body = decision_request()
    body["args"] = {**body["args"], "amount_minor": amount_minor, **args}
    return body


def permit_claims(token: str) -> dict[str, Any]:
    """The (unverified) claims of a compact JWS, to compare what it binds."""
    import base64
    import json

    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def review_bundle(folder: Any, tenant: str, *, timeout_ms: int = 1_800_000) -> Any:
    """A Python-rule bundle for ``tenant`` only: every ``send_message`` call needs one
    finance approval within ``timeout_ms``; ``/card_number`` is masked. Free-text
    arguments (no catalogue) let tests send markup. Returns the folder holding it."""
    bundle = folder / "bundles" / f"review-all-{tenant}"
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / "manifest.toml").write_text(
        f'id = "review-all-{tenant}"\nversion = "1.0.0"\nengine = "python"\n'
        f'entrypoint = "decide"\ntenants = ["{tenant}"]\n')
    (bundle / "rules.py").write_text(
        "def decide(input):\n"
        "    if input['tool']['name'] != 'send_message':\n"
        "        return {'effect': 'deny', 'reasons': ['only send_message']}\n"
        "    return {'effect': 'require_approval',\n"
        "            'reasons': [{'code': 'needs_review', 'message': 'messages are reviewed'}],\n"
        "            'approval': {'require': [{'role': 'finance', 'count': 1}],\n"
        f"                         'timeout_ms': {timeout_ms},\n"
        "                         'distinct_from': 'initiator_and_previous'},\n"
        "            'mask': ['/card_number']}\n")
    return folder / "bundles"


def message_request(**args: Any) -> dict[str, Any]:
    from tests.conftest import decision_request

    return decision_request(tool={"name": "send_message"},
                            args={"to": "customer-42", "body": "hello", **args})

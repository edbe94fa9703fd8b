"""The same-origin check on every state-changing ``/ui`` request, against live servers
(issue 13, fault 8): a valid CSRF token from a foreign ``Origin`` changes nothing."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from cosigner.core.clock import system_clock
from cosigner.db.database import Database
from cosigner.db.tables import audit_events
from cosigner.identity.principals import create_api_key
from cosigner.web import sessions
from tests.conftest import ROOT, LiveServer, start_module_server
from tests.web.conftest import PASSWORD, add_user, csrf_of, refund_request

PROXY = "127.0.0.1"
FOREIGN = "https://evil.example"


@pytest.fixture(scope="module")
def live(db_kind: str, pg_url: str | None, sqlite_template: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, str]]:
    """One ``cosigner serve --forwarded-allow-ips 127.0.0.1`` for the module."""
    server, url = start_module_server(
        tmp_path_factory.mktemp("origin"), db_kind=db_kind, pg_url=pg_url,
        sqlite_template=sqlite_template, bundle_dirs=[ROOT / "policies"],
        args=("--forwarded-allow-ips", PROXY))
    yield server, url
    server.stop()


class Scene:
    """A tenant with a finance approver ``alice`` signed in, and one pending refund."""

    def __init__(self, server: LiveServer, database_url: str, tenant: str) -> None:
        self.server, self.database_url, self.tenant = server, database_url, tenant
        self.client = httpx.AsyncClient(base_url=server.url, timeout=30,
                                        headers={"Origin": server.url})
        self.approval_id = ""

    async def setup(self) -> None:
        db = Database(self.database_url)
        try:
            await add_user(db, self.tenant, "alice", "finance")
            key, _ = await create_api_key(db, tenant=self.tenant, roles=["runtime"],
                                          subject="agent-runtime", clock=system_clock)
        finally:
            await db.dispose()
        decision = (await self.client.post("/v1/decisions", json=refund_request(),
                                           headers={"Authorization": f"Bearer {key}"})).json()
        assert decision["effect"] == "require_approval", decision
        self.approval_id = decision["approval"]["id"]
        form = await self.client.get("/ui/login")
        signed_in = await self.client.post("/ui/login", data={
            "tenant": self.tenant, "name": "alice", "password": PASSWORD,
            "csrf_token": csrf_of(form.text)})
        assert signed_in.status_code == 303

    async def review_form(self) -> dict[str, str]:
        """The fields of the approve form, exactly as the detail page fills them."""
        html = (await self.client.get(f"/ui/approvals/{self.approval_id}")).text
        shown = re.search(r'id="args-hash">([^<]+)<', html)
        assert shown
        return {"csrf_token": csrf_of(html), "args_hash": shown.group(1)}

    async def status(self) -> str:
        page = await self.client.get(f"/ui/approvals/{self.approval_id}")
        match = re.search(r'class="badge ([a-z]+)"', page.text)
        assert match
        return match.group(1)

    async def refusals(self) -> list[dict[str, object]]:
        db = Database(self.database_url)
        try:
            async with db.read() as conn:
                bodies = (await conn.execute(select(audit_events.c.body).where(
                    audit_events.c.tenant == self.tenant,
                    audit_events.c.type == "web.request_refused"))).scalars().all()
        finally:
            await db.dispose()
        return [json.loads(b) if isinstance(b, str) else dict(b) for b in bodies]


@pytest.fixture
async def scene(live: tuple[LiveServer, str], tenant: str) -> AsyncIterator[Scene]:
    made = Scene(live[0], live[1], tenant)
    await made.setup()
    yield made
    await made.client.aclose()


def _refused(response: httpx.Response) -> bool:
    return response.status_code == 403 and 'id="error-code">cross_origin<' in response.text


@pytest.mark.parametrize("decision", ["approved", "rejected"])
async def test_review_from_a_foreign_origin_is_refused(scene: Scene, decision: str) -> None:
    form = await scene.review_form()
    response = await scene.client.post(
        f"/ui/approvals/{scene.approval_id}/review", headers={"Origin": FOREIGN},
        data={**form, "decision": decision, "comment": "looks fine"})
    assert _refused(response)
    assert await scene.status() == "pending"
    refusals = await scene.refusals()
    assert len(refusals) == 1 and refusals[0]["payload"] == {
        "code": "cross_origin", "method": "POST",
        "path": f"/ui/approvals/{scene.approval_id}/review",
        "reason": f"Origin '{FOREIGN}' is not this server's"}
    assert refusals[0]["actor"]["subject"] == "alice"  # type: ignore[index]
    # The same form from the server's own origin is accepted.
    same = await scene.client.post(f"/ui/approvals/{scene.approval_id}/review",
                                   data={**form, "decision": decision, "comment": "ok"})
    assert same.status_code == 303 and await scene.status() == decision


@pytest.mark.parametrize("headers", [
    {"Origin": "http://127.0.0.1:1"},            # same host, another port
    {"Origin": "https://127.0.0.1"},             # another scheme
    {"Origin": "null"},
    {"Origin": ""},
    {"Sec-Fetch-Site": "cross-site"},            # no Origin: Sec-Fetch-Site decides
    {"Sec-Fetch-Site": "same-site"},
    {},                                           # neither header: refused on /ui
], ids=["port", "scheme", "null", "empty", "cross-site", "same-site", "neither"])
async def test_sign_out_from_anywhere_but_this_origin_is_refused(
        scene: Scene, headers: dict[str, str]) -> None:
    html = (await scene.client.get("/ui")).text
    scene.client.headers.pop("Origin")
    response = await scene.client.post("/ui/logout", headers=headers,
                                       data={"csrf_token": csrf_of(html)})
    assert _refused(response)
    assert (await scene.client.get("/ui")).status_code == 200  # still signed in


async def test_sign_out_with_sec_fetch_site_same_origin_works(scene: Scene) -> None:
    html = (await scene.client.get("/ui")).text
    scene.client.headers.pop("Origin")
    response = await scene.client.post("/ui/logout", headers={"Sec-Fetch-Site": "same-origin"},
                                       data={"csrf_token": csrf_of(html)})
    assert response.status_code == 303
    assert (await scene.client.get("/ui")).status_code == 303  # signed out


async def test_sign_in_from_a_foreign_origin_is_refused(scene: Scene) -> None:
    async with httpx.AsyncClient(base_url=scene.server.url, timeout=30) as client:
        form = await client.get("/ui/login")
        response = await client.post("/ui/login", headers={"Origin": FOREIGN}, data={
            "tenant": scene.tenant, "name": "alice", "password": PASSWORD,
            "csrf_token": csrf_of(form.text)})
        assert _refused(response)
        assert sessions.COOKIE not in client.cookies


async def _sign_in_behind_proxy(server: LiveServer, scene: Scene, peer: str) -> int:
    """Sign in as a browser at https://cosigner.example would, through ``peer``."""
    public = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "cosigner.example",
              "X-Forwarded-For": "2001:db8::77"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30, headers=public,
                                 transport=httpx.AsyncHTTPTransport(local_address=peer)
                                 ) as client:
        form = await client.get("/ui/login")
        pre = form.cookies[sessions.PRE_COOKIE]  # Secure: the client would not send it
        response = await client.post(
            "/ui/login", headers={"Origin": "https://cosigner.example",
                                  "Cookie": f"{sessions.PRE_COOKIE}={pre}"},
            data={"tenant": scene.tenant, "name": "alice", "password": PASSWORD,
                  "csrf_token": csrf_of(form.text)})
        return 403 if _refused(response) else response.status_code


async def test_forwarded_proto_and_host_count_only_from_a_trusted_proxy(scene: Scene) -> None:
    assert await _sign_in_behind_proxy(scene.server, scene, PROXY) == 303
    assert await _sign_in_behind_proxy(scene.server, scene, "127.0.3.3") == 403

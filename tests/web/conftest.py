"""Helpers for the approver web form tests (httpx and Playwright)."""

from __future__ import annotations

import re
from typing import Any

import httpx

from server import accounts
from server.clock import system_clock
from server.db.database import Database

PASSWORD = "correct horse battery staple"
_CSRF = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')


async def add_user(db: Database, tenant: str, name: str, *roles: str,
                   password: str = PASSWORD, clock: Any = system_clock) -> str:
    return await accounts.add_user(db, tenant=tenant, name=name, roles=list(roles),
                                   password=password, clock=clock)


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

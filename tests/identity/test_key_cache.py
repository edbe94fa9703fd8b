"""The verified-key memo of KeyAuthenticator (issue 20): a key checked in full once is
answered by one lookup afterwards, and never outlives its cache entry, a generation bump,
``forget()`` or the freshness window; a wrong secret is never answered from it."""

from __future__ import annotations

import time

import pytest

from cosigner.identity import principals
from tests.conftest import Harness


async def test_verified_key_memo_follows_the_cache(harness: Harness, tenant: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    key = await harness.key(tenant, "runtime")
    auth = principals.KeyAuthenticator(harness.db)
    auth.observe(1, fresh_for_s=60)
    caller = await auth.authenticate(key)
    assert auth.cached(key) is caller
    assert key in auth._verified
    wrong = key[:-1] + ("A" if key[-1] != "A" else "B")
    assert auth.cached(wrong) is None
    assert wrong not in auth._verified

    auth.observe(2, fresh_for_s=60)  # a credential change somewhere: everything forgotten
    assert auth.cached(key) is None and not auth._verified
    await auth.authenticate(key)
    assert auth.cached(key) is caller or auth.cached(key) == caller
    auth.forget()
    assert auth.cached(key) is None and not auth._verified

    await auth.authenticate(key)
    assert auth.cached(key) is not None
    real = time.monotonic
    monkeypatch.setattr(principals.time, "monotonic",
                        lambda: real() + principals.KEY_CACHE_TTL_S + 1)
    auth.observe(2, fresh_for_s=60)
    assert auth.cached(key) is None  # the entry expired: the memo does not answer


async def test_memo_needs_a_fresh_generation(harness: Harness, tenant: str) -> None:
    key = await harness.key(tenant, "runtime")
    auth = principals.KeyAuthenticator(harness.db)
    auth.observe(1, fresh_for_s=60)
    await auth.authenticate(key)
    auth.observe(1, fresh_for_s=-1)  # no fresh observation: the database is asked
    assert auth.cached(key) is None

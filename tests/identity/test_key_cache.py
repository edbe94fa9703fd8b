"""The verified-key memo of KeyAuthenticator (issue 20): a key checked in full once is
answered by one lookup afterwards, and never outlives its cache entry, a generation bump,
``forget()`` or the freshness window; a wrong secret is never answered from it."""

from __future__ import annotations

import asyncio
import time

import pytest

from cosigner.core.errors import Unauthenticated
from cosigner.db.tables import api_keys
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


def _count_reads(auth: principals.KeyAuthenticator, monkeypatch: pytest.MonkeyPatch,
                 gate: asyncio.Event | None = None,
                 held: asyncio.Event | None = None) -> list[str]:
    """Record each database read of ``auth`` (by key id); ``gate``: the first one reads,
    then sets ``held`` and holds its answer until the gate is set."""
    reads: list[str] = []
    real = auth._read

    async def counted(key_id: str, now: float) -> principals._CacheEntry:
        reads.append(key_id)
        entry = await real(key_id, now)
        if gate is not None and held is not None and len(reads) == 1:
            held.set()
            await gate.wait()
        return entry

    monkeypatch.setattr(auth, "_read", counted)
    return reads


@pytest.mark.parametrize("fresh", [True, False])
async def test_a_cold_burst_of_one_key_makes_one_read(
        harness: Harness, tenant: str, monkeypatch: pytest.MonkeyPatch, fresh: bool) -> None:
    key = await harness.key(tenant, "runtime")
    auth = principals.KeyAuthenticator(harness.db)
    if fresh:
        auth.observe(1, fresh_for_s=60)  # the cache answers afterwards
    reads = _count_reads(auth, monkeypatch)
    callers = await asyncio.gather(*(auth.authenticate(key) for _ in range(200)))
    assert {c.tenant for c in callers} == {tenant}
    assert len(reads) == 1
    wrong = key[:-1] + ("A" if key[-1] != "A" else "B")
    results = await asyncio.gather(*(auth.authenticate(wrong) for _ in range(50)),
                                   return_exceptions=True)
    assert all(isinstance(r, Unauthenticated) for r in results)
    # Fresh: answered from the cache; not fresh: every burst asks once more.
    assert len(reads) == (1 if fresh else 2)


async def test_a_read_begun_before_a_disable_is_not_joined_after_it(
        harness: Harness, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    key = await harness.key(tenant, "runtime")
    auth = principals.KeyAuthenticator(harness.db)
    auth.observe(1, fresh_for_s=60)
    gate, held = asyncio.Event(), asyncio.Event()
    reads = _count_reads(auth, monkeypatch, gate, held)
    early = asyncio.create_task(auth.authenticate(key))
    await held.wait()  # its read is done, its answer held
    key_id = key.split("_")[1]
    async with harness.db.transaction() as conn:
        await conn.execute(api_keys.update().where(api_keys.c.id == key_id)
                           .values(revoked_at=harness.context.clock()))
    auth.forget()  # what this process does after a disable
    with pytest.raises(Unauthenticated):
        await auth.authenticate(key)  # its own read, not the one begun before
    gate.set()
    assert (await early).tenant == tenant  # it began before the revoke committed
    assert len(reads) == 2


async def test_unknown_ids_are_evicted_before_known_keys(
        harness: Harness, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(principals, "KEY_CACHE_MAX", 10)
    key = await harness.key(tenant, "runtime")
    auth = principals.KeyAuthenticator(harness.db)
    auth.observe(1, fresh_for_s=60)
    caller = await auth.authenticate(key)
    for i in range(30):
        with pytest.raises(Unauthenticated):
            await auth.authenticate(f"csk_{i:016x}_{'A' * 43}")
        assert len(auth._cache) <= 10
    assert auth.cached(key) == caller  # the flood of made-up ids did not evict it


async def test_a_stale_cache_never_answers_a_request_from_a_read_begun_before_it(
        harness: Harness, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    key = await harness.key(tenant, "runtime")
    auth = principals.KeyAuthenticator(harness.db)  # never observed: every request reads
    gate, held = asyncio.Event(), asyncio.Event()
    _count_reads(auth, monkeypatch, gate, held)
    early = asyncio.create_task(auth.authenticate(key))
    await held.wait()  # its read is done (the key active), its answer held
    key_id = key.split("_")[1]
    async with harness.db.transaction() as conn:
        await conn.execute(api_keys.update().where(api_keys.c.id == key_id)
                           .values(revoked_at=harness.context.clock()))
    late = asyncio.create_task(auth.authenticate(key))  # arrives after the revoke
    await asyncio.sleep(0)
    gate.set()
    assert (await early).tenant == tenant
    with pytest.raises(Unauthenticated):
        await late

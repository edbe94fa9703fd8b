"""The signing keyring in the database (cosigner.keys.store): sealed at rest, one KEK, the key
files of older versions imported once, rotation published before it signs (issue 13)."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import event, select

from cosigner.core.clock import FrozenClock
from cosigner.core.errors import Unauthenticated
from cosigner.core.settings import Settings
from cosigner.db.database import Database
from cosigner.db.tables_keys import signing_keys
from cosigner.identity.principals import KeyAuthenticator, create_api_key
from cosigner.keys.keyring import Keyring, KeyringError
from cosigner.keys.store import KEK_FILE, KeyringFollower, KeyStore, load_kek, unseal
from tests.conftest import migrated_database

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
KEK = bytes(range(32))
OTHER_KEK = bytes(range(1, 33))


@pytest.fixture
async def fresh_db(tmp_path: Path, sqlite_template: Path) -> Database:
    """A database of this test alone (SQLite: the keyring table starts empty, which a
    shared PostgreSQL session database does not)."""
    db = Database(migrated_database(tmp_path, "sqlite", None, sqlite_template))
    yield db  # type: ignore[misc]
    await db.dispose()


def store(db: Database, *, kek: bytes = KEK, key_dir: Path | None = None,
          delay_s: float = 2.0) -> KeyStore:
    return KeyStore(db, kek=kek, max_token_lifetime_s=3600, activation_delay_s=delay_s,
                    key_dir=key_dir)


def private_bytes(keyring: Keyring) -> bytes:
    d = str(keyring._signing_key.as_dict(private=True)["d"])
    return base64.urlsafe_b64decode(d + "=" * (-len(d) % 4))


async def test_private_key_is_sealed_in_the_database(fresh_db: Database) -> None:
    keyring = await store(fresh_db).open(now=T0)
    async with fresh_db.read() as conn:
        row = (await conn.execute(select(signing_keys))).one()
    raw = private_bytes(keyring)
    assert row.kid == keyring.current_kid
    assert raw not in row.private_sealed
    assert base64.urlsafe_b64encode(raw).rstrip(b"=") not in row.private_sealed
    assert unseal(KEK, row.kid, row.private_sealed) == raw
    with pytest.raises(KeyringError):  # the kid is associated data: another row's fails
        unseal(KEK, "another-kid", row.private_sealed)


async def test_wrong_kek_refuses_to_start_with_a_clear_error(fresh_db: Database) -> None:
    await store(fresh_db).open(now=T0)
    with pytest.raises(KeyringError, match="key-encryption key"):
        await store(fresh_db, kek=OTHER_KEK).open(now=T0)


async def test_a_second_process_with_the_same_kek_gets_the_same_keyring(
        fresh_db: Database) -> None:
    first = await store(fresh_db).open(now=T0)
    second = await store(fresh_db).open(now=T0 + timedelta(seconds=5))
    assert second.current_kid == first.current_kid
    assert second.jwks(now=T0) == first.jwks(now=T0)
    token = second.sign({"x": 1}, typ="t")
    assert first.verify(token, typ="t") == {"x": 1}


def test_kek_file_is_generated_private_once_and_reused(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COSIGNER_KEY_ENCRYPTION_KEY")
    settings = Settings(key_dir=tmp_path / "keys")
    assert settings.key_encryption_key is None
    kek = load_kek(settings)
    path = tmp_path / "keys" / KEK_FILE
    assert len(kek) == 32 and path.stat().st_mode & 0o777 == 0o600
    assert load_kek(settings) == kek


def test_kek_setting_must_be_32_bytes_base64url() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        Settings(key_encryption_key=base64.urlsafe_b64encode(b"short").decode())
    kek = base64.urlsafe_b64encode(OTHER_KEK).decode().rstrip("=")
    assert load_kek(Settings(key_encryption_key=kek)) == OTHER_KEK


async def test_key_files_are_imported_once(fresh_db: Database, tmp_path: Path) -> None:
    key_dir = tmp_path / "keys"
    files = Keyring.load_or_create(key_dir, now=T0, max_token_lifetime_s=3600)
    old_kid = files.current_kid
    files.rotate(now=T0 + timedelta(seconds=10))
    token = files.sign({"x": 1}, typ="t")
    later = T0 + timedelta(seconds=20)

    keyring = await store(fresh_db, key_dir=key_dir).open(now=later)
    assert keyring.current_kid == files.current_kid
    assert {k["kid"] for k in keyring.jwks(now=later)["keys"]} == {old_kid, files.current_kid}
    assert keyring.verify(token, typ="t") == {"x": 1}
    async with fresh_db.read() as conn:
        rows = {r.kid: r for r in (await conn.execute(select(signing_keys))).all()}
    assert rows[old_kid].private_sealed is None  # a retired key's private part is not kept

    # Once: a key file added later is not imported.
    Keyring.load_or_create(tmp_path / "other", now=T0, max_token_lifetime_s=3600)
    for path in (tmp_path / "other").glob("*.json"):
        path.rename(key_dir / path.name)
    again = await store(fresh_db, key_dir=key_dir).open(now=later)
    assert {k["kid"] for k in again.jwks(now=later)["keys"]} == set(rows)


async def test_rotation_is_published_at_once_and_signs_after_the_activation_delay(
        fresh_db: Database) -> None:
    keys = store(fresh_db, delay_s=2.0)
    clock = FrozenClock(T0)
    follower_keyring = await keys.open(now=T0)  # another replica's keyring
    follower = KeyringFollower(store(fresh_db), follower_keyring, clock)
    await follower.observe(0, T0)
    old_kid = follower_keyring.current_kid

    rotation = await keys.rotate(now=T0 + timedelta(seconds=1))
    assert rotation.old_kid == old_kid
    assert rotation.activates_at == T0 + timedelta(seconds=3)
    await follower.observe(1, T0 + timedelta(seconds=1))
    published = {k["kid"] for k in follower_keyring.jwks(now=T0)["keys"]}
    assert published == {old_kid, rotation.new_kid}
    assert follower_keyring.current_kid == old_kid  # published, not signing yet

    await follower.observe(1, T0 + timedelta(seconds=3))
    assert follower_keyring.current_kid == rotation.new_kid
    # The old key stays published until its permits (max lifetime) have expired.
    after = T0 + timedelta(seconds=3 + 3600)
    assert old_kid in {k["kid"] for k in follower_keyring.jwks(now=after)["keys"]}
    gone = after + timedelta(seconds=3)
    assert old_kid not in {k["kid"] for k in follower_keyring.jwks(now=gone)["keys"]}


async def test_unknown_kid_reloads_the_keyring_once_before_refusing(
        fresh_db: Database) -> None:
    signer = await store(fresh_db, delay_s=0).open(now=T0)
    verifier = await store(fresh_db, delay_s=0).open(now=T0)
    KeyringFollower(store(fresh_db), verifier, FrozenClock(T0 + timedelta(seconds=2)))
    rotating = store(fresh_db, delay_s=0)
    await rotating.rotate(now=T0 + timedelta(seconds=1))
    signer.install(await rotating.load(), now=T0 + timedelta(seconds=2))
    token = signer.sign({"x": 1}, typ="t")
    with pytest.raises(Exception, match="not known"):
        verifier.verify(token, typ="t")
    assert await verifier.refresh_for_unknown_kid()
    assert verifier.verify(token, typ="t") == {"x": 1}
    assert not await verifier.refresh_for_unknown_kid()  # rate-limited


def count_queries(db: Database) -> list[str]:
    """The SELECTs ``db`` sends from now on (real SQLAlchemy events, nothing replaced)."""
    seen: list[str] = []

    def on_execute(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append(statement)

    event.listen(db.engine.sync_engine, "before_cursor_execute", on_execute)
    return seen


async def test_known_and_unknown_key_ids_do_the_same_database_work(
        fresh_db: Database) -> None:
    key, _ = await create_api_key(fresh_db, tenant="acme", roles=["runtime"], subject="rt",
                                  clock=FrozenClock(T0))
    unknown = "csk_0123456789abcdef_" + key[21:]  # csk_<16 hex>_<secret>
    wrong_secret = key[:21] + "A" * 43
    auth = KeyAuthenticator(fresh_db)
    auth.observe(0, fresh_for_s=60)
    statements = count_queries(fresh_db)
    for _ in range(5):
        await auth.authenticate(key)
    known_work = len(statements)
    for _ in range(5):
        with pytest.raises(Unauthenticated):
            await auth.authenticate(unknown)
    unknown_work = len(statements) - known_work
    assert known_work == unknown_work == 1  # one lookup each, then the cache (negative too)
    with pytest.raises(Unauthenticated, match="invalid API key"):
        await auth.authenticate(wrong_secret)
    assert len(statements) == 2


async def test_a_new_credential_generation_empties_the_cache(fresh_db: Database) -> None:
    from cosigner.identity import accounts

    key, _ = await create_api_key(fresh_db, tenant="acme", roles=["runtime"], subject="rt",
                                  clock=FrozenClock(T0))
    auth = KeyAuthenticator(fresh_db)
    auth.observe(0, fresh_for_s=60)
    await auth.authenticate(key)
    other_process = Database(fresh_db.url)
    try:
        await accounts.disable_principal(other_process, tenant="acme", name="rt",
                                         clock=FrozenClock(T0))
    finally:
        await other_process.dispose()
    await auth.authenticate(key)  # cached: this process has not polled yet
    from cosigner.db import generations

    current = await generations.read_all(fresh_db)  # what the poll reads
    assert current[generations.CREDENTIALS] == 1
    auth.observe(current[generations.CREDENTIALS], fresh_for_s=60)
    with pytest.raises(Unauthenticated, match="revoked or principal disabled"):
        await auth.authenticate(key)


async def test_signing_alg_applies_to_keys_created_from_then_on(fresh_db: Database) -> None:
    """Switching ``COSIGNER_SIGNING_ALG``: the existing key keeps its alg (tokens it signed
    stay valid), the rotated-in key gets the new one; each verifies only under its own."""
    first = await store(fresh_db).open(now=T0)
    old_token = first.sign({"n": 1}, typ="t")
    eddsa = KeyStore(fresh_db, kek=KEK, max_token_lifetime_s=3600, activation_delay_s=0,
                     alg="EdDSA")
    assert (await eddsa.open(now=T0)).jwks(now=T0)["keys"][0]["alg"] == "Ed25519"
    rotation = await eddsa.rotate(now=T0 + timedelta(seconds=1))
    later = T0 + timedelta(seconds=2)
    keyring = await eddsa.open(now=later)
    assert {k["kid"]: k["alg"] for k in keyring.jwks(now=later)["keys"]} == {
        rotation.old_kid: "Ed25519", rotation.new_kid: "EdDSA"}
    new_token = keyring.sign({"n": 2}, typ="t")
    assert keyring.verify(old_token, typ="t") == {"n": 1}
    assert keyring.verify(new_token, typ="t") == {"n": 2}
    async with fresh_db.read() as conn:
        stored = dict((await conn.execute(select(signing_keys.c.kid, signing_keys.c.alg))).all())
    assert stored == {rotation.old_kid: "Ed25519", rotation.new_kid: "EdDSA"}

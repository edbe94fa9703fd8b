"""Tables of state every replica shares: the signing keyring and change generations.

``signing_keys`` holds one row per Ed25519 key, with the one JWS ``alg`` it uses. The public
key (``x``, base64url) is in clear; the private key is sealed with AES-256-GCM under the
key-encryption key (:mod:`cosigner.keys.store`): ``private_sealed`` = 12-byte nonce ‖
ciphertext ‖ tag, with the kid as associated data. It is NULL once the key is retired (a
retired key never signs).

``replica_generations`` holds one counter per kind of shared state (``signing_keys``,
``credentials``); a writer bumps it in the transaction of its change, and each replica
polls the counters to know when to reload (:mod:`cosigner.db.replica_sync`).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, DateTime, LargeBinary, String, Table

from cosigner.db.tables import metadata

signing_keys = Table(
    "signing_keys",
    metadata,
    Column("kid", String(64), primary_key=True),  # RFC 7638 thumbprint of the public key
    Column("x", String(64), nullable=False),  # public key, base64url (RFC 8037)
    Column("private_sealed", LargeBinary, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("activates_at", DateTime(timezone=True), nullable=False),  # starts signing
    Column("retired_at", DateTime(timezone=True), nullable=True),  # stops signing
    Column("not_after", DateTime(timezone=True), nullable=True),  # unpublished from then
    # The one JWS alg the key signs and verifies under (Ed25519 | EdDSA), fixed at creation.
    Column("alg", String(16), nullable=False, server_default="Ed25519"),
)

replica_generations = Table(
    "replica_generations",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("generation", BigInteger, nullable=False),
)

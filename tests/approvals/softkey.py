"""A software WebAuthn authenticator (ES256, P-256) for tests that need no browser.

It builds what a platform authenticator returns (W3C WebAuthn Level 3 §6.1, §6.5): "none"
attestation objects for ``navigator.credentials.create()`` and assertions for ``get()``,
with user presence and (unless told otherwise) user verification flags, and a counter.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import Any

import cbor2
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from cosigner.core.review_statements import b64url, from_b64url

UP, UV, AT = 0x01, 0x04, 0x40


class SoftAuthenticator:
    def __init__(self, rp_id: str, origin: str) -> None:
        self.rp_id, self.origin = rp_id, origin
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.credential_id = os.urandom(16)
        self.counter = 0

    @property
    def id(self) -> str:
        return b64url(self.credential_id)

    def cose_key(self) -> bytes:
        numbers = self.key.public_key().public_numbers()
        return cbor2.dumps({1: 2, 3: -7, -1: 1, -2: numbers.x.to_bytes(32, "big"),
                            -3: numbers.y.to_bytes(32, "big")})

    def _auth_data(self, flags: int, attested: bytes = b"") -> bytes:
        self.counter += 1
        return (hashlib.sha256(self.rp_id.encode()).digest() + bytes([flags])
                + struct.pack(">I", self.counter) + attested)

    def _client_data(self, kind: str, challenge: bytes, origin: str | None) -> bytes:
        return json.dumps({"type": kind, "challenge": b64url(challenge),
                           "origin": origin or self.origin, "crossOrigin": False}).encode()

    def create(self, options: dict[str, Any], *, uv: bool = True) -> dict[str, Any]:
        """The response to ``navigator.credentials.create({publicKey: options})``."""
        attested = (bytes(16) + struct.pack(">H", len(self.credential_id))
                    + self.credential_id + self.cose_key())
        auth_data = self._auth_data(UP | AT | (UV if uv else 0), attested)
        client = self._client_data("webauthn.create", from_b64url(options["challenge"]), None)
        attestation = cbor2.dumps({"fmt": "none", "attStmt": {}, "authData": auth_data})
        return {"id": self.id, "rawId": self.id, "type": "public-key",
                "response": {"clientDataJSON": b64url(client),
                             "attestationObject": b64url(attestation), "transports": []},
                "clientExtensionResults": {}}

    def get(self, challenge: bytes, *, uv: bool = True, origin: str | None = None
            ) -> dict[str, Any]:
        """The response to ``navigator.credentials.get()`` over ``challenge``."""
        auth_data = self._auth_data(UP | (UV if uv else 0))
        client = self._client_data("webauthn.get", challenge, origin)
        signature = self.key.sign(auth_data + hashlib.sha256(client).digest(),
                                  ec.ECDSA(hashes.SHA256()))
        return {"id": self.id, "rawId": self.id, "type": "public-key",
                "response": {"authenticatorData": b64url(auth_data),
                             "clientDataJSON": b64url(client), "signature": b64url(signature),
                             "userHandle": None}}

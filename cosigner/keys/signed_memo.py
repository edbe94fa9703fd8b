"""The signatures this process made lately, so a token it signed is verified without libsodium.

A permit is usually redeemed by the server that minted it, seconds later; verifying its
Ed25519 signature (libsodium's ``crypto_sign_open``, ~60–75 µs on the bench machine) is
then the largest single cost of a redeem (issue 20). Ed25519 (RFC 8032) is deterministic
and correct: the signature this process computed over a signing input with a key verifies
under that key's public key. So when a presented token carries, byte for byte, a
signature segment this process produced, over the same signing input (compared by
SHA-256), with the same public key as the entry the token's ``kid`` names, the
signature check's answer is known: valid. Anything else — another signature, another
payload or header, another key, a token older than the memo — is checked by libsodium
as before. Every other check of :meth:`cosigner.keys.keyring.Keyring.verify` (header,
``kid`` published at ``now``, ``alg``, ``typ``, the payload's strict JSON) still runs.

A signer may attach an object to a signature (:meth:`SignedMemo.remember`'s ``attached``):
:meth:`SignedMemo.recall` gives it back under the same exact match, so a caller that
attached what decoding the token's payload would give (the permit's parsed claims,
cosigner.permits.tokens) need not decode it again.

Bounded: two generations of at most ``capacity`` entries each (the older one is dropped
whole when the newer fills), so at most ``2 × capacity`` signatures are held (~320 B
each, ~1.1 KB with a permit's claims attached (measured with tracemalloc): ≤ 9 MB at the
default under sustained minting, nothing when idle), and each operation is O(1).
"""

from __future__ import annotations

import hashlib

__all__ = ["SignedMemo"]

#: Signatures per generation: at 1,000 permits/s, a permit redeemed within ~4 s of its
#: minting is always found.
CAPACITY = 4096


class SignedMemo:
    """Signature segment (base64url text) → (public key, SHA-256 of the signing input,
    the object attached to it).

    Thread-safe under the GIL: each step is one dict operation or one attribute swap.
    """

    __slots__ = ("_capacity", "_new", "_old")

    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self._capacity = capacity
        self._new: dict[str, tuple[bytes, bytes, object]] = {}
        self._old: dict[str, tuple[bytes, bytes, object]] = {}

    def __len__(self) -> int:
        return len(self._new) + len(self._old)

    def remember(self, signature: str, public: bytes, signing_input: bytes,
                 attached: object = None) -> None:
        """Record that ``signature`` (base64url, no padding) is this process's Ed25519
        signature of ``signing_input`` with the key whose raw public key is ``public``,
        with ``attached`` (any object, read-only once given; ``None``: nothing)."""
        new = self._new
        if len(new) >= self._capacity:
            self._old, new = new, {}
            self._new = new
        new[signature] = (public, hashlib.sha256(signing_input).digest(), attached)

    def vouches(self, signature: str, public: bytes, signing_input: bytes) -> bool:
        """True when :meth:`remember` recorded exactly this signature, public key and
        signing input (the signature then verifies); False means "unknown", not invalid."""
        return self.recall(signature, public, signing_input)[0]

    def recall(self, signature: str, public: bytes, signing_input: bytes
               ) -> tuple[bool, object]:
        """``(`` :meth:`vouches` ``, the object remembered with the signature)``: the
        object is ``None`` unless vouched for."""
        seen = self._new.get(signature) or self._old.get(signature)
        if (seen is not None and seen[0] == public
                and seen[1] == hashlib.sha256(signing_input).digest()):
            return True, seen[2]
        return False, None

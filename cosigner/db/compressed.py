"""Columns stored zstd-compressed with a fixed dictionary (issue 20, "store each fact once").

An allow decision wrote ~5.9 KB: two event bodies, the response with its permit token
and the stored policy input are JSON texts of the same keys, names and hashes over and
over. Compressed with a raw-content dictionary of one typical decision
(:mod:`cosigner.db.zdict_v1`), an event body of 1.1 KB takes ~120 bytes, for ~5 µs of
CPU to write and ~3 µs to read.

Only the storage changes: what the columns give back is exactly what was written
(the RFC 8785 text of an event, the JSON value of a response), so hashes, exports,
``cosigner audit verify`` and every reader see the same bytes as before.

Stored forms: ``b"\\x01" + zstd frame`` (format byte 1 = dictionary v1), and for a
Decision v1 answer holding a permit (:class:`ResponseJSON`, migration
``0020_s5store_facts_once``) ``b"\\x02" + zstd frame`` of the answer with its token's
place left empty, followed by the token's decoded header and claims (JSON) and its raw
signature: the claims repeat the answer's decision id, args hash, policy and permit id,
which the frame then stores as back-references instead of ~700 bytes of base64 over
them. The token is rebuilt byte for byte (its segments are base64url of exactly those
bytes, checked before packing; a token that is not re-spelled identically is stored as
it is, format 1). Values written
before migration ``0017_lean_storage`` read back unchanged: on SQLite they are still TEXT
(``str``); on PostgreSQL the migration turned them into ``bytea`` holding their UTF-8
text, which starts with ``{`` or another JSON character, never with a format byte.
Formats 4-6 (``audit_events.body`` against the rows before it) are
:mod:`cosigner.db.event_row`'s, in frames without zstd's magic number
(:func:`compress_bare`). Format 7 is :mod:`cosigner.db.response_row`'s form 3 in such a
frame (migration ``0024_s12store_response_bare``).

Compression settings (issue 20, session 12): events' frames (the largest share of the
CPU, ~4.5 µs a pair) at level 1; everything else (the stored answer, the call input,
events outside a pair) with :data:`STORE_PARAMS`, a lazy2 search tuned on the bench's
varied allow calls: the answer's frame 367 → 331 bytes for ~4 µs more, which with the
frame's magic number gone and the run id left to its row (form 7,
:mod:`cosigner.db.response_row`) puts 7 decision rows in a 4 KB SQLite page instead of 6.
Any setting writes frames every zstd decoder reads: old rows read as before.
"""

from __future__ import annotations

import binascii
import json
import re
import struct
from typing import Any

import orjson
import zstandard
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from cosigner.db.driver_types import RawBlob
from cosigner.db.zdict_v1 import DICTIONARY

#: Format byte of values compressed with dictionary v1.
V1 = 1
#: Format byte of a response whose permit token is stored decoded (see the docstring).
V2_TOKEN = 2
#: Form 2 less the texts its own row holds (:mod:`cosigner.db.response_row`, 0022).
V3_ROW = 3
#: Form 3 in a frame without zstd's magic number (:mod:`cosigner.db.response_row`, 0024).
V7_ROW_BARE = 7
#: The format bytes of a response read with its row (:class:`RowBound`).
#: Form 8: an allow answer as the facts it is built from (:mod:`cosigner.db.answer_facts`).
V8_FACTS = 8
ROW_FORMS = frozenset({V3_ROW, V7_ROW_BARE, V8_FACTS})
_LEVEL = 1
#: What every frame but the events' is compressed with (module docstring; measured on
#: 5,000 varied allow answers: level 1 367 B in 5.6 µs, level 6 336 B in 8.8 µs, these
#: 331 B in 9.8 µs).
STORE_PARAMS = {"window_log": 12, "hash_log": 13, "chain_log": 13, "search_log": 4,
                "min_match": 3, "target_length": 0, "strategy": zstandard.STRATEGY_LAZY2}
_FRAME_FLAGS = {"write_checksum": False, "write_content_size": True, "write_dict_id": False}

_DICT = zstandard.ZstdCompressionDict(DICTIONARY, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
_DICT.precompute_compress(level=_LEVEL)
_STORE_DICT = zstandard.ZstdCompressionDict(DICTIONARY,
                                            dict_type=zstandard.DICT_TYPE_RAWCONTENT)
_STORE_DICT.precompute_compress(compression_params=zstandard.ZstdCompressionParameters(
    **STORE_PARAMS, **_FRAME_FLAGS))
_COMPRESSOR = zstandard.ZstdCompressor(
    dict_data=_STORE_DICT,
    compression_params=zstandard.ZstdCompressionParameters(**STORE_PARAMS, **_FRAME_FLAGS))
#: Level 1 with the magic number: stored form 3 as written before 0024 (its downgrade).
_LEVEL1_COMPRESSOR = zstandard.ZstdCompressor(level=_LEVEL, dict_data=_DICT, write_checksum=False,
                                              write_content_size=True, write_dict_id=False)
_DECOMPRESSOR = zstandard.ZstdDecompressor(dict_data=_DICT)
_PREFIX = bytes([V1])
#: The same frames without zstd's 4-byte magic number (the format byte says what
#: follows): forms 4 and 6 of :mod:`cosigner.db.event_row` (level 1) and form 7 of
#: :mod:`cosigner.db.response_row` (:data:`STORE_PARAMS`).
_BARE_COMPRESSOR = zstandard.ZstdCompressor(
    dict_data=_DICT, compression_params=zstandard.ZstdCompressionParameters.from_level(
        _LEVEL, format=zstandard.FORMAT_ZSTD1_MAGICLESS, **_FRAME_FLAGS))
_BARE_STORE_COMPRESSOR = zstandard.ZstdCompressor(
    dict_data=_STORE_DICT, compression_params=zstandard.ZstdCompressionParameters(
        **STORE_PARAMS, format=zstandard.FORMAT_ZSTD1_MAGICLESS, **_FRAME_FLAGS))
_BARE_DECOMPRESSOR = zstandard.ZstdDecompressor(
    dict_data=_DICT, format=zstandard.FORMAT_ZSTD1_MAGICLESS)


def compress(data: bytes) -> bytes:
    """``data`` in the stored form (format byte + zstd frame)."""
    return _PREFIX + _COMPRESSOR.compress(data)


def decompress(stored: bytes | bytearray | memoryview | str) -> bytes:
    """The bytes that were written: a stored form unpacked, a pre-0017 value as is.

    Raises:
        ValueError: an unknown format byte, or a damaged frame.
    """
    if isinstance(stored, str):
        return stored.encode()
    data = bytes(stored)
    if not data or data[0] >= 0x20:  # JSON text written before 0017 (UTF-8)
        return data
    if data[0] == V2_TOKEN:
        return _json_bytes(_unpack_response(data))
    if data[0] in ROW_FORMS:
        raise ValueError("a form 3, 7 or 8 response is read with its row "
                         "(cosigner.db.response_row)")
    if data[0] != V1:
        raise ValueError(f"unknown compressed column format {data[0]}")
    return _unzstd(data)


def compress_bare(data: bytes) -> bytes:
    """``data`` as a dictionary v1 zstd frame without its magic number."""
    return _BARE_COMPRESSOR.compress(data)


def compress_bare_store(data: bytes) -> bytes:
    """``data`` as :func:`compress_bare` gives it, compressed with :data:`STORE_PARAMS`
    (read by :func:`decompress_bare`)."""
    return _BARE_STORE_COMPRESSOR.compress(data)


def decompress_bare(frame: bytes) -> bytes:
    """:func:`compress_bare` undone. Raises ValueError for a damaged frame (see
    :func:`_unzstd`)."""
    try:
        return _BARE_DECOMPRESSOR.decompress(frame)
    except zstandard.ZstdError as exc:
        raise ValueError(f"damaged compressed column: {exc}") from exc
    except MemoryError as exc:
        raise ValueError(_TOO_BIG) from exc


#: zstd allocates the content size a frame header declares before decoding: a damaged
#: header may declare petabytes (``MemoryError``); a claim that fits is allocated lazily
#: and the damaged frame then fails to decode (``ZstdError``). Both are damage.
_TOO_BIG = "damaged compressed column: its frame declares more bytes than can be allocated"


def _unzstd(data: bytes) -> bytes:
    try:
        return _DECOMPRESSOR.decompress(data[1:])
    except zstandard.ZstdError as exc:
        raise ValueError(f"damaged compressed column: {exc}") from exc
    except MemoryError as exc:
        raise ValueError(_TOO_BIG) from exc


def _json_bytes(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # keys that are not strings, integers beyond 64 bits
        return json.dumps(value, separators=(",", ":")).encode()


def bind_text(value: str | None) -> bytes | None:
    """What a :class:`CompressedText` column stores for ``value`` (``None`` stays ``None``)."""
    return None if value is None else compress(value.encode())


def bind_json(value: Any) -> bytes | None:
    """What a :class:`CompressedJSON` column stores for ``value`` (``None`` stays ``None``)."""
    return None if value is None else compress(_json_bytes(value))


def bind_response(value: Any) -> bytes | None:
    """What a :class:`ResponseJSON` column stores for ``value`` (``None`` stays ``None``)."""
    if value is None:
        return None
    packed = pack_response(value)
    return packed if packed is not None else compress(_json_bytes(value))


class CompressedText(TypeDecorator[str]):
    """A text column (an event's canonical body) stored compressed; reads give ``str``."""

    impl = RawBlob
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> bytes | None:
        return bind_text(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        if value is None or isinstance(value, str):
            return value
        return decompress(value).decode()


class CompressedJSON(TypeDecorator[Any]):
    """A JSON column stored compressed (compact JSON inside); reads give the value."""

    impl = RawBlob
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> bytes | None:
        return bind_json(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        if isinstance(value, str):
            return orjson.loads(value)
        return loads_json(decompress(value))


class ResponseJSON(CompressedJSON):
    """``decisions.response``: a Decision v1 answer stored compressed, its permit token
    (``permit.token``, a compact JWS) stored decoded (format 2, see the module docstring);
    reads give the value with the token rebuilt byte for byte."""

    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> bytes | None:
        return bind_response(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if value is not None and not isinstance(value, str):
            data = bytes(value)
            if data and data[0] == V2_TOKEN:
                return _unpack_response(data)
            if data and data[0] in ROW_FORMS:
                return RowBound(data)
        return super().process_result_value(value, dialect)


class RowBound:
    """A stored form 3 answer as read: it needs its row's id, request id, args hash and
    policy revision (:func:`cosigner.db.response_row.answer`). Not a mapping, so a reader
    that forgot to resolve it fails instead of reading a wrong answer."""

    __slots__ = ("stored",)

    def __init__(self, stored: bytes) -> None:
        self.stored = stored

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RowBound) and other.stored == self.stored

    def __hash__(self) -> int:
        return hash(self.stored)


_LEN = struct.Struct(">I")


def pack_response(value: Any) -> bytes | None:
    """``value`` (a Decision v1 answer) in stored form 2, or ``None`` when it holds no
    permit token that re-spells exactly (then it is stored as form 1)."""
    parts = response_parts(value)
    if parts is None:
        return None
    return bytes([V2_TOKEN]) + _COMPRESSOR.compress(join_parts(*parts))


def response_parts(value: Any) -> tuple[bytes, bytes, bytes, bytes] | None:
    """``(answer with the token's place empty, header, claims, signature)`` of a Decision
    v1 answer whose permit token re-spells exactly, else ``None``."""
    permit = value.get("permit") if isinstance(value, dict) else None
    token = permit.get("token") if isinstance(permit, dict) else None
    if not isinstance(token, str) or not isinstance(value, dict) or not isinstance(
            permit, dict):
        return None
    known = _minted.pop(token, None) or _minted_before.pop(token, None)  # stored once
    if known is None:
        parts = token.split(".")
        if len(parts) != 3:
            return None
        header, claims, signature = (_b64url_exact(part) for part in parts)
        if header is None or claims is None or signature is None:
            return None  # not the one spelling of its bytes: keep it as it was written
        known = header, claims, signature
    answer = _json_bytes({**value, "permit": {**permit, "token": ""}})
    return answer, *known


#: Tokens minted and not stored yet → the bytes their segments spell
#: (:func:`remember_token`; :func:`response_parts` takes an entry out as it uses it, so
#: only permits in flight are held): two generations of at most :data:`_MINTED_MAX` (the
#: older dropped whole when the newer fills), for permits that are never stored here.
_minted: dict[str, tuple[bytes, bytes, bytes]] = {}
_minted_before: dict[str, tuple[bytes, bytes, bytes]] = {}
_MINTED_MAX = 2048


def remember_token(token: str, header: bytes, claims: bytes, signature: bytes) -> None:
    """Record that compact JWS ``token`` is exactly the unpadded base64url of ``header``,
    ``claims`` and ``signature`` joined by ``.`` (as
    :meth:`cosigner.keys.keyring.Keyring.sign_parts` returns them), so storing it in form
    2 or 3 takes those bytes instead of decoding the token and spelling it again, once
    (a token stored again is decoded): what :func:`response_parts` gives is the same
    either way (tests/db/test_token_parts.py)."""
    global _minted, _minted_before  # noqa: PLW0603 - two generations, swapped whole
    if len(_minted) >= _MINTED_MAX:
        _minted_before, _minted = _minted, {}
    _minted[token] = (header, claims, signature)


def join_parts(answer: bytes, header: bytes, claims: bytes, signature: bytes) -> bytes:
    """The uncompressed body of forms 2 and 3 (three length-prefixed parts, then the
    signature)."""
    return b"".join((_LEN.pack(len(answer)), answer, _LEN.pack(len(header)), header,
                     _LEN.pack(len(claims)), claims, signature))


def split_parts(body: bytes) -> tuple[bytes, bytes, bytes, bytes]:
    """:func:`join_parts` undone. Raises ValueError for a damaged body."""
    pieces, at = [], 0
    try:
        for _ in range(3):
            (size,) = _LEN.unpack_from(body, at)
            pieces.append(body[at + 4:at + 4 + size])
            at += 4 + size
    except struct.error as exc:
        raise ValueError("damaged compressed response") from exc
    return pieces[0], pieces[1], pieces[2], body[at:]


def answer_of(answer: bytes, header: bytes, claims: bytes, signature: bytes) -> Any:
    """The answer (JSON) with its token rebuilt from the decoded parts."""
    value = loads_json(answer)
    value["permit"]["token"] = ".".join(_b64url(raw) for raw in (header, claims, signature))
    return value


def _unpack_response(data: bytes) -> Any:
    """The answer of a stored form 2 value, its token rebuilt."""
    return answer_of(*split_parts(_unzstd(data)))


def _b64url(raw: bytes) -> str:
    return binascii.b2a_base64(raw, newline=False).translate(_TO_URL).rstrip(b"=").decode(
        "ascii")


_TO_URL = bytes.maketrans(b"+/", b"-_")
_FROM_URL = bytes.maketrans(b"-_", b"+/")


def _b64url_exact(part: str) -> bytes | None:
    """The bytes whose unpadded base64url spelling is exactly ``part``, else ``None``
    (``base64.urlsafe_b64decode`` with the padding added, checked by encoding back)."""
    if not part.isascii():
        return None
    data = part.encode("ascii")
    try:
        raw = binascii.a2b_base64(data.translate(_FROM_URL) + b"=" * (-len(data) % 4))
    except binascii.Error:
        return None
    spelled = binascii.b2a_base64(raw, newline=False).translate(_TO_URL).rstrip(b"=")
    return raw if spelled == data else None


def loads_json(data: bytes) -> Any:
    """The JSON value of ``data``: orjson, or the stdlib where a run of 20 or more digits
    may be an integer beyond 64 bits (orjson would read it as a float, not refuse it)."""
    if _LONG_DIGITS.search(data) is not None:
        return json.loads(data)
    return orjson.loads(data)


#: 20 digits: more than uint64's 18446744073709551615 may need; the stdlib reads those.
_LONG_DIGITS = re.compile(rb"[0-9]{20}")

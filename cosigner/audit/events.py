"""An audit event and its hashed body (schema version 1).

:func:`stored_body` gives an event's body as the chain stores it (payload masked,
:mod:`cosigner.audit.masking`), its RFC 8785 text and ``"sha256:" + hex(SHA-256(text))``
(:mod:`cosigner.audit.chain` links the bodies). :func:`event_body` and :func:`hash_body`
are the definition: mask the payload, build the object, canonicalize it
(:func:`cosigner.core.canonical.canonicalize`) and hash.

The common event takes a shorter road to the same bytes (:func:`_fast_body`): one orjson
serialization with sorted keys is the canonical text, and one walk over the body both
checks its value types (``canonical._check``'s job) and collects its member names
(whether one is always-masked: :func:`cosigner.audit.masking.none_masked`, the
masking walk's job). It is taken only where it is proven to give what the definition
gives, else the definition runs (and raises what it raises):

* orjson is told to refuse what ``canonicalize`` refuses or prints another way: str/int/
  dict/list subclasses, dataclasses and datetimes (passed through to no ``default``:
  refused), integers outside ±(2**53 − 1) (``OPT_STRICT_INTEGER``); orjson itself
  refuses keys that are not exactly ``str`` and lone surrogates;
* :func:`_plain` proves every value is exactly ``dict``, ``list``, ``str``, ``int``,
  ``bool`` or ``None`` (no float, tuple, enum, UUID, which orjson would print);
* a text with a character beyond the BMP falls back (a key there would sort by UTF-16
  code units in RFC 8785, by code points in orjson).

What is left is a value ``canonical._check`` finds "simple", whose RFC 8785 bytes are by
definition orjson's output with sorted keys (:func:`cosigner.core.fastjson.dumps_sorted`).
Masking: the payload is masked at the event's pointers first (as
:func:`masked_payload`); when no member name anywhere in the body is always-masked (the
body's own names can only refuse), the masking walk would change nothing more.
tests/audit/test_events.py checks both roads give the same body, text and hash.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from datetime import datetime
from typing import Any

import orjson

from cosigner.audit.masking import mask_pointers, mask_with_paths, none_masked
from cosigner.core.canonical import canonicalize, hash_bytes
from cosigner.core.clock import isoformat

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class Event:
    """What a domain function records.

    ``mask`` lists JSON pointers into ``payload`` to redact; :func:`append` applies them
    and the always-masked keys (:mod:`cosigner.audit.masking`) before hashing, and the
    stored payload lists what it hid in ``masked_paths``.
    """

    type: str
    actor: dict[str, Any]
    decision_id: str | None = None
    approval_id: str | None = None
    permit_jti: str | None = None
    run_id: str | None = None
    tool: str | None = None
    args_hash: str | None = None
    effect: str | None = None
    principal: str | None = None
    policy: dict[str, str] | None = None
    payload: dict[str, Any] | None = None
    mask: tuple[str, ...] = ()
    #: When it happened; ``append``'s ``now`` when unset.
    time: datetime | None = None
    #: ``shadow`` for a shadow-mode decision (a query column; the body carries it too).
    mode: str | None = None


def _slot_init(cls: type) -> Callable[..., None]:
    """``cls.__init__`` as the frozen dataclass generates it (same parameters, defaults
    and order; each field set once), setting each slot through its member descriptor
    instead of ``object.__setattr__``, which looks the name up again on every call: an
    event is built at ~60 % of the cost (several per decision, issue 20).
    tests/audit/test_events.py checks it builds what the generated ``__init__`` builds."""
    names: dict[str, Any] = {}
    params, lines = [], []
    for item in fields(cls):
        if item.default is MISSING:
            params.append(item.name)
        else:
            names[f"d_{item.name}"] = item.default
            params.append(f"{item.name}=d_{item.name}")
        names[f"s_{item.name}"] = cls.__dict__[item.name].__set__
        lines.append(f"    s_{item.name}(self, {item.name})\n")
    source = f"def __init__(self, {', '.join(params)}):\n{''.join(lines)}"
    exec(compile(source, f"<{cls.__name__}.__init__>", "exec"), names)  # noqa: S102 - built above from the class's own field names
    init: Callable[..., None] = names["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


#: The generated ``__init__``, kept for the test that compares the two.
_dataclass_init = Event.__init__
setattr(Event, "__init__", _slot_init(Event))  # noqa: B010 - mypy keeps the dataclass's


def masked_payload(event: Event) -> dict[str, Any]:
    """The payload as stored: masked, plus the sorted ``masked_paths`` when anything was
    masked (no ``masked_paths`` member means nothing was hidden)."""
    payload, paths = mask_with_paths(event.payload or {}, event.mask)
    if not isinstance(payload, dict):  # the pointer "" masked the whole payload
        payload = {"masked": payload}
    return {**payload, "masked_paths": paths} if paths else payload


def event_body(event: Event, *, tenant: str, seq: int, time: datetime,
               prev_hash: str) -> dict[str, Any]:
    """The hashed JSON object of one event (schema version 1)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "type": event.type,
        "tenant": tenant,
        "seq": seq,
        "time": isoformat(time),
        "actor": event.actor,
        "subject": {
            k: v for k, v in (("decision_id", event.decision_id),
                              ("approval_id", event.approval_id),
                              ("permit_jti", event.permit_jti),
                              ("run_id", event.run_id)) if v is not None
        },
        "tool": event.tool,
        "args_hash": event.args_hash,
        "effect": event.effect,
        "policy": event.policy,
        "payload": masked_payload(event),
        "prev_hash": prev_hash,
    }


def hash_body(body: dict[str, Any]) -> tuple[str, str]:
    """``(canonical JSON text, hash)`` of an event body."""
    canonical = canonicalize(body)
    return canonical.decode(), hash_bytes(canonical)


def stored_body(event: Event, *, tenant: str, seq: int, time: datetime, prev_hash: str
                ) -> tuple[dict[str, Any], str, str]:
    """``(body, canonical JSON text, hash)`` of ``event`` as the chain stores it: exactly
    :func:`event_body` and :func:`hash_body` (see the module docstring).

    Raises:
        InvalidJSON: the body has no RFC 8785 form (as :func:`hash_body`).
    """
    body, canonical, digest = stored_bytes(event, tenant=tenant, seq=seq, time=time,
                                           prev_hash=prev_hash)
    return body, canonical.decode(), digest


def stored_bytes(event: Event, *, tenant: str, seq: int, time: datetime, prev_hash: str
                 ) -> tuple[dict[str, Any], bytes, str]:
    """:func:`stored_body` with the canonical text as its UTF-8 bytes (what the chain
    stores and hashes)."""
    fast = _fast_body(event, tenant, seq, time, prev_hash)
    if fast is not None:
        body, canonical = fast
        return body, canonical, hash_bytes(canonical)
    body = event_body(event, tenant=tenant, seq=seq, time=time, prev_hash=prev_hash)
    canonical = canonicalize(body)
    return body, canonical, hash_bytes(canonical)


#: orjson options of the fast road: sorted keys (RFC 8785 order for BMP keys), and the
#: values ``canonicalize`` refuses or writes differently refused (module docstring).
_FAST_OPTIONS = (orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER
                 | orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS
                 | orjson.OPT_PASSTHROUGH_DATETIME)
#: Lead bytes of UTF-8's four-byte sequences (characters beyond the BMP).
_BEYOND_BMP = re.compile(rb"[\xf0-\xf4]")


def _fast_body(event: Event, tenant: str, seq: int, time: datetime, prev_hash: str
               ) -> tuple[dict[str, Any], bytes] | None:
    """``(body, RFC 8785 bytes)`` when proven equal to the definition's, else ``None``."""
    payload: Any = event.payload or {}
    if event.mask:
        payload, found = mask_pointers(payload, event.mask)
        if type(payload) is not dict:
            return None
        if found:
            payload = {**payload, "masked_paths": sorted(set(found))}
    elif type(payload) is not dict:
        return None
    subject = {}
    if event.decision_id is not None:
        subject["decision_id"] = event.decision_id
    if event.approval_id is not None:
        subject["approval_id"] = event.approval_id
    if event.permit_jti is not None:
        subject["permit_jti"] = event.permit_jti
    if event.run_id is not None:
        subject["run_id"] = event.run_id
    body = {"schema_version": SCHEMA_VERSION, "type": event.type, "tenant": tenant,
            "seq": seq, "time": isoformat(time), "actor": event.actor, "subject": subject,
            "tool": event.tool, "args_hash": event.args_hash, "effect": event.effect,
            "policy": event.policy, "payload": payload, "prev_hash": prev_hash}
    try:
        text = orjson.dumps(body, option=_FAST_OPTIONS)
    except orjson.JSONEncodeError:
        return None
    if not text.isascii() and _BEYOND_BMP.search(text):
        return None
    names: set[str] = set()
    try:
        if not _plain(body, names):
            return None
    except RecursionError:
        return None
    if names:
        if not none_masked(names):
            return None
        if len(_CLEAR) + len(names) <= _CLEAR_MAX:
            _CLEAR.update(names)
    return body, text


_NoneType = type(None)
#: Member names :func:`none_masked` found not always-masked (a pure function of the
#: name): an object whose names are all here adds none to check. Bounded.
_CLEAR: set[str] = set()
_CLEAR_MAX = 4096


def _plain(value: dict[str, Any] | list[Any], names: set[str]) -> bool:
    """True when everything in ``value`` is exactly a dict, list, str, int, bool or None;
    adds to ``names`` the member names of every object in it not known clear
    (:data:`_CLEAR`: most bodies repeat the names of the ones before)."""
    if type(value) is dict:
        if not _CLEAR.issuperset(value):
            names.update(value)
        items: Any = value.values()
    else:
        items = value
    for item in items:
        kind = type(item)
        if kind is str or kind is int or kind is _NoneType or kind is bool:
            continue
        if (kind is dict or kind is list) and _plain(item, names):
            continue
        return False
    return True

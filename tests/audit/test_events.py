"""An event's stored body, text and hash are the definition's, whichever road computes them.

:func:`cosigner.audit.events.stored_body` takes a shorter road for the common event
(one orjson serialization, one walk); :func:`event_body` + :func:`hash_body` (mask the
payload, build the object, RFC 8785, SHA-256) are the definition. Checked with hypothesis
on events whose payloads hold what either road must get right: floats (RFC 8785 prints
``1.0`` as ``1``), NaN, integers beyond ±(2**53 − 1), characters beyond the BMP in keys
and values, lone surrogates, tuples, subclasses, always-masked keys in every spelling,
mask pointers, and non-string keys.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields, replace
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cosigner.audit import events
from cosigner.audit.events import Event, event_body, hash_body, stored_body
from cosigner.audit.masking import MASK


class Kind(Enum):
    A = "a"


class Name(str):
    pass


KEYS = (st.sampled_from(["amount", "note", "token", "API-Key", "client_secret", "x_password",
                         "Authorization", "to_ken", "İd", "\u212aey", "𝒜b", "\uff41", "é", "a\"b",
                         "a\\b", "tok\nen", "masked_paths", "0", "1"])
        | st.text(max_size=6))
SCALARS = (st.none() | st.booleans() | st.integers(-(2**54), 2**54)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
           | st.sampled_from([MASK, "😀", "\ud800", Name("sub"), Kind.A, 2**70, 1.0, -0.0]))
VALUES = st.recursive(
    SCALARS,
    lambda inner: (st.lists(inner, max_size=3) | st.lists(inner, max_size=2).map(tuple)
                   | st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=14)
#: The JSON an event really holds, so the short road is taken often.
PLAIN_KEYS = st.sampled_from(["amount", "note", "id", "é", "İd", "a\"b", "0"]) | st.text(
    alphabet="abcdefgh_-ÿ✓", max_size=6)
BMP_TEXT = st.text(st.characters(max_codepoint=0xFFFF, exclude_categories=("Cs",)),
                   max_size=8)
PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1)
    | BMP_TEXT | st.sampled_from(["😀", MASK, "token", 2**53 - 1]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(PLAIN_KEYS, inner,
                                                                max_size=4),
    max_leaves=14)
POINTERS = st.lists(st.sampled_from(["", "/amount", "/args", "/args/note", "/args/0",
                                     "/nope", "note", "/token", "/a~1b"]), max_size=3)
IDS = st.none() | BMP_TEXT


@st.composite
def an_event(draw: st.DrawFn) -> Event:
    plain = st.dictionaries(PLAIN_KEYS, PLAIN, max_size=5)
    payload = draw(plain | plain.map(lambda args: {"args": args, "request_id": "r"})
                   | st.none() | st.dictionaries(KEYS, PLAIN | VALUES, max_size=5) | VALUES)
    return Event(
        type=draw(st.sampled_from(["decision.made", "permit.minted"])),
        actor=draw(st.fixed_dictionaries({"kind": st.just("key"), "subject": BMP_TEXT})
                   | st.dictionaries(PLAIN_KEYS, PLAIN, max_size=2)
                   | st.dictionaries(KEYS, SCALARS, max_size=2)),
        decision_id=draw(IDS), approval_id=draw(IDS), permit_jti=draw(IDS),
        run_id=draw(IDS), tool=draw(IDS), args_hash=draw(IDS), effect=draw(IDS),
        policy=draw(st.none() | st.fixed_dictionaries({"id": st.text(max_size=4),
                                                       "version": st.just("1.0.0")})),
        payload=payload, mask=tuple(draw(POINTERS)))


def outcome(compute: Any) -> Any:
    try:
        return "ok", compute()
    except Exception as exc:  # noqa: BLE001 - both roads must fail alike
        return type(exc), str(exc)


@settings(max_examples=1500, deadline=None)
@given(event=an_event(), seq=st.integers(1, 2**40),
       time=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1),
                         timezones=st.just(UTC)))
def test_stored_body_is_the_definition(event: Event, seq: int, time: datetime) -> None:
    where = {"tenant": "t", "seq": seq, "time": time, "prev_hash": "sha256:" + "0" * 64}

    def definition() -> tuple[dict[str, Any], str, str]:
        body = event_body(event, **where)  # type: ignore[arg-type]
        return (body, *hash_body(body))

    assert outcome(lambda: stored_body(event, **where)) == outcome(definition)  # type: ignore[arg-type]


def test_the_short_road_is_taken_for_a_decision_event() -> None:
    event = Event(type="decision.made", actor={"kind": "key", "subject": "s"},
                  decision_id="d", run_id="r", tool="issue_refund", args_hash="h",
                  effect="allow", policy={"id": "p", "version": "1"},
                  payload={"args": {"amount": 5, "note": "n"}, "reasons": [{"code": "ok"}]},
                  mask=("/args/note",))
    now = datetime(2026, 12, 1, tzinfo=UTC)
    fast = events._fast_body(event, "t", 1, now, "p")
    assert fast is not None
    body, text = fast
    assert body["payload"]["args"]["note"] == MASK
    assert body["payload"]["masked_paths"] == ["/args/note"]
    assert (body, text.decode()) == (lambda b: (b, hash_body(b)[0]))(
        event_body(event, tenant="t", seq=1, time=now, prev_hash="p"))
    later = now + timedelta(microseconds=1)
    for payload in ({"amount": 1.5}, {"token": "x"}, {"k": (1,)}, {"😀": 1, "\uff41": 2}):
        odd = Event(type="x", actor={}, payload=payload, time=later)
        assert events._fast_body(odd, "t", 1, later, "p") is None


def test_names_known_clear_never_hide_a_masked_one() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    clean = Event(type="x", actor={"kind": "key"}, payload={"args": {"amount": 1}}, time=now)
    assert events._fast_body(clean, "t", 1, now, "p") is not None
    assert {"amount", "args", "kind"} <= events._CLEAR
    # Every other name of these objects is known clear: the one masked name still counts.
    for payload in ({"args": {"amount": 1, "token": "x"}}, {"args": {"amount": 1},
                                                           "API-Key": "k"}):
        odd = Event(type="x", actor={"kind": "key"}, payload=payload, time=now)
        assert events._fast_body(odd, "t", 1, now, "p") is None
        body, _, _ = stored_body(odd, tenant="t", seq=1, time=now, prev_hash="p")
        assert body["payload"]["masked_paths"]


def _built(init: Any, *args: Any, **kwargs: Any) -> Any:
    event = object.__new__(Event)
    try:
        init(event, *args, **kwargs)
    except TypeError as exc:
        return TypeError, str(exc).split("() ", 1)[-1]  # the function's name differs
    return tuple(getattr(event, item.name) for item in fields(Event))


FIELDS = [item.name for item in fields(Event)]


@settings(max_examples=300, deadline=None)
@given(given_fields=st.dictionaries(st.sampled_from([*FIELDS, "nope"]),
                                    st.none() | st.text(max_size=3)),
       positional=st.lists(st.text(max_size=3), max_size=len(FIELDS) + 1))
def test_the_slot_init_builds_what_the_dataclass_init_builds(
        given_fields: dict[str, Any], positional: list[str]) -> None:
    # (The generated one's TypeError messages name the class qualname the same way.)
    assert (_built(Event.__init__, *positional, **given_fields)
            == _built(events._dataclass_init, *positional, **given_fields))
    event = Event(type="x", actor={}, tool="t")
    assert replace(event, tool="u") == Event(type="x", actor={}, tool="u")
    with pytest.raises(FrozenInstanceError):
        event.tool = "v"  # type: ignore[misc]

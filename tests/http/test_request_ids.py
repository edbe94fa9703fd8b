"""New request ids (cosigner.http.telemetry.request_id): version-4 UUIDs in hex, made a
batch at a time from one ``os.urandom`` call, never handed out twice, and not repeated by
a forked child."""

from __future__ import annotations

import os
import re
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cosigner.http import telemetry
from cosigner.http.telemetry import random_ids, request_id


@given(st.lists(st.binary(min_size=16, max_size=16), min_size=1, max_size=20))
def test_random_ids_are_uuid4_hex_of_each_chunk(chunks: list[bytes]) -> None:
    assert random_ids(b"".join(chunks)) == [uuid.UUID(bytes=c, version=4).hex
                                            for c in chunks]


def test_new_ids_come_from_urandom_and_never_repeat(monkeypatch: pytest.MonkeyPatch
                                                   ) -> None:
    drawn: list[bytes] = []
    real = os.urandom

    def urandom(n: int) -> bytes:
        drawn.append(real(n))
        return drawn[-1]

    telemetry._fresh.clear()
    monkeypatch.setattr(os, "urandom", urandom)
    ids = [request_id(None) for _ in range(3 * telemetry._BATCH + 1)]
    assert len(drawn) == 4  # one system call per batch
    made = {uuid.UUID(bytes=raw[at:at + 16], version=4).hex
            for raw in drawn for at in range(0, len(raw), 16)}
    assert set(ids) <= made and len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}", i) for i in ids)


def test_given_plain_ids_are_kept_others_replaced() -> None:
    assert request_id(b"abc-1.2_3") == "abc-1.2_3"
    for bad in (b"", b"a b", b"x" * 65, "é".encode()):
        assert len(request_id(bad)) == 32


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    request_id(None)  # the parent holds unused ids
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then leave at once, whatever happened
        try:  # (a child escaping here would go on running the rest of the session)
            os.write(write, request_id(None).encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 32
    assert child != request_id(None)

"""RFC 6901 segments: escape and unescape are inverse, in the order the RFC fixes."""

from hypothesis import given
from hypothesis import strategies as st

from cosigner.core import pointer


def test_rfc6901_examples() -> None:
    assert pointer.escape("a/b") == "a~1b"
    assert pointer.escape("m~n") == "m~0n"
    assert pointer.unescape("~01") == "~1"  # not "/": ~1 is decoded first (RFC 6901 §4)
    assert pointer.join(["a/b", "0", ""]) == "/a~1b/0/"
    assert pointer.join([]) == ""


@given(st.text())
def test_unescape_inverts_escape(key: str) -> None:
    assert pointer.unescape(pointer.escape(key)) == key

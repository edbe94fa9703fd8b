"""JSON Pointer (RFC 6901) segments: the one place ``~`` and ``/`` are escaped.

Used by strict parsing (:mod:`cosigner.core.canonical`, to name where a request is
malformed) and by masking (:mod:`cosigner.audit.masking`, to find the paths a catalogue or
policy masks).
"""

from __future__ import annotations

from collections.abc import Iterable


def escape(key: str) -> str:
    """One member name as a pointer segment (RFC 6901 §3: ``~`` → ``~0``, ``/`` → ``~1``)."""
    return key.replace("~", "~0").replace("/", "~1")


def unescape(segment: str) -> str:
    """The member name a pointer segment stands for (RFC 6901 §4: ``~1`` first, then ``~0``)."""
    return segment.replace("~1", "/").replace("~0", "~")


def join(keys: Iterable[str]) -> str:
    """The pointer of a path of member names / array indices (``""`` for the document)."""
    return "".join("/" + escape(key) for key in keys)


_MISSING = object()


def resolve(document: object, pointer: str, default: object = None) -> object:
    """The value ``pointer`` names in ``document`` (RFC 6901 §4), or ``default`` when it
    names nothing (a missing member, an index out of range or not a number)."""
    if pointer == "":
        return document
    if not pointer.startswith("/"):
        return default
    node: object = document
    for segment in pointer[1:].split("/"):
        key = unescape(segment)
        if isinstance(node, dict):
            node = node.get(key, _MISSING)
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return default
        if node is _MISSING:
            return default
    return node

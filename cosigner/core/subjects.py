"""One identity per person: the canonical form of a subject id (DESIGN § Tenancy).

A subject is compared, and is unique, only in its canonical form: Unicode NFKC, then case
fold, then NFKC again (case folding can leave a string that is no longer NFKC, e.g.
``ǰ``; the second pass makes the function idempotent). So ``alice@corp.example``,
``Alice@Corp.Example``, ``ALICE@corp.example`` and the full-width ``ａｌｉｃｅ@corp.example``
are one person.

:func:`canonical_subject` is for a subject about to be stored (principals, users, API
keys): it refuses what cannot name a person unambiguously. :func:`subject_key` is for
comparing ids the server did not create (the ``initiator`` and ``principal`` a runtime
attests): the same folding, never an error.
"""

from __future__ import annotations

import unicodedata

from cosigner.core.errors import InvalidRequest

MAX_SUBJECT_CHARS = 256
#: Unicode categories refused anywhere in a subject: control (Cc), format (Cf: zero-width
#: joiners, bidi overrides), surrogates (Cs), private use (Co), unassigned (Cn), and line
#: or paragraph separators (Zl, Zp).
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def subject_key(value: str) -> str:
    """The canonical form of ``value`` without checks: NFKC, case fold, NFKC."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", value).casefold())


def canonical_subject(value: str) -> str:
    """The canonical form of a subject to store, or :class:`InvalidRequest`.

    Raises:
        InvalidRequest: ``invalid_subject`` — empty, surrounding whitespace (in the given
            or the canonical form), a control/format/unassigned character, or longer than
            256 characters once canonical.
    """
    if not value or not value.strip():
        raise InvalidRequest("a subject id must not be empty", code="invalid_subject")
    if value != value.strip():
        raise InvalidRequest("a subject id must not start or end with whitespace",
                             code="invalid_subject")
    for char in value:
        if unicodedata.category(char) in _REFUSED_CATEGORIES:
            raise InvalidRequest(
                f"a subject id must not contain the character U+{ord(char):04X}",
                code="invalid_subject")
    canonical = subject_key(value)
    if canonical != canonical.strip():  # e.g. a trailing U+3000 folds to a space
        raise InvalidRequest("a subject id must not start or end with whitespace",
                             code="invalid_subject")
    if len(canonical) > MAX_SUBJECT_CHARS:
        raise InvalidRequest(f"a subject id is at most {MAX_SUBJECT_CHARS} characters",
                             code="invalid_subject")
    return canonical

"""Review probes (session 7) for cosigner.policy.catalogue.ecma_pattern.

Expected answers were computed with node's ``new RegExp(p).test(s)`` (ECMA-262, no flags).
"""

from __future__ import annotations

import re

import pytest

from cosigner.policy.catalogue import ecma_pattern

# (pattern, instance, ECMA-262's answer): a "-" beside a class escape inside [...] is a
# literal "-" (ECMA-262 B.1.2), never a range with the escape's expansion.
CASES = [
    (r"^[\w-z]$", "-", True), (r"^[\w-z]$", "`", False), (r"^[\w-z]$", "z", True),
    (r"^[+-\d]$", "-", True), (r"^[+-\d]$", ",", False), (r"^[+-\d]$", "5", True),
    (r"^[+-\d]$", ".", False), (r"^[\d-z]$", "-", True), (r"^[\d-z]$", "y", False),
    (r"^[\D-a]$", "-", True), (r"^[\D-a]$", "5", False), (r"^[\W-a]$", "b", False),
    (r"^[\W-a]$", "-", True), (r"^[\d-\w]$", "-", True), (r"^[\d-\w]$", "!", False),
    (r"^[a-\d]$", "-", True), (r"^[a-\d]$", "b", False), (r"^[a-\d]$", "3", True),
    (r"^[\w-]+$", "a-b", True), (r"^[\w-]+$", "a.b", False), (r"^[\]\d]$", "]", True),
    (r"^[\]\d]$", "\\", False), (r"^\\d$", "\\d", True), (r"^\\d$", "5", False),
    (r"^[^\d-z]$", "-", False), (r"^[^\d-z]$", "a", True), (r"^[\s-\d]$", "-", True),
]


@pytest.mark.parametrize(("pattern", "instance", "expected"), CASES)
def test_dash_beside_a_class_escape_is_literal(pattern: str, instance: str,
                                               expected: bool) -> None:
    assert bool(re.compile(ecma_pattern(pattern)).search(instance)) is expected

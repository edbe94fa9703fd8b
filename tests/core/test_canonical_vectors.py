"""The server side of the shared RFC 8785 golden vectors (the client checks the same file
in tests/client/test_canonical.py), cases K19 and K20."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cosigner.core.canonical import args_hash, canonicalize, parse_json
from cosigner.core.errors import InvalidJSON

VECTORS = json.loads((Path(__file__).parents[1] / "canonical_vectors.json").read_text("utf-8"))


@pytest.mark.parametrize("vector", VECTORS["accept"], ids=lambda v: v["description"])
def test_server_matches_golden_vector(vector: dict[str, Any]) -> None:
    value = parse_json(vector["json"].encode("utf-8"))
    assert canonicalize(value) == vector["canonical"].encode("utf-8")
    assert args_hash(value) == vector["hash"]


@pytest.mark.parametrize("vector", VECTORS["reject"], ids=lambda v: v["description"])
def test_server_rejects_golden_vector(vector: dict[str, Any]) -> None:
    with pytest.raises(InvalidJSON) as info:
        parse_json(vector["json"].encode("utf-8"))
    assert info.value.code == vector["code"]

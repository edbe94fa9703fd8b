"""Masking before write (invariant 10): catalogue/policy pointers and always-masked keys."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cosigner.audit.masking import MASK, is_always_masked, mask_value, mask_with_paths


def test_pointers_mask_nested_values_and_list_items() -> None:
    doc = {"card": {"number": "4111", "cvc": "123"}, "items": [{"sku": "a"}, {"sku": "b"}]}
    masked, paths = mask_with_paths(doc, ["/card/number", "/items/1/sku"])
    assert masked == {"card": {"number": MASK, "cvc": "123"},
                      "items": [{"sku": "a"}, {"sku": MASK}]}
    assert paths == ["/card/number", "/items/1/sku"]
    assert doc["card"]["number"] == "4111"  # the input is never modified


def test_missing_pointers_mask_nothing_and_are_not_listed() -> None:
    assert mask_with_paths({"a": 1}, ["/b", "/a/x", "/0", "nope"]) == ({"a": 1}, [])


def test_rfc6901_escapes() -> None:
    masked, paths = mask_with_paths({"a/b": 1, "m~n": 2}, ["/a~1b", "/m~0n"])
    assert masked == {"a/b": MASK, "m~n": MASK} and paths == ["/a~1b", "/m~0n"]


def test_empty_pointer_masks_the_whole_document() -> None:
    assert mask_value({"a": 1}, [""]) == MASK


def test_always_masked_keys_at_any_depth_case_insensitive() -> None:
    doc = {"Authorization": "Bearer x", "nested": [{"PassWord": "p", "api-key": "k",
                                                    "apiKey": "k2", "access_token": "t",
                                                    "client_secret": "s"}],
           "max_tokens": 5, "tokenizer": "bpe"}
    masked, paths = mask_with_paths(doc)
    assert masked == {"Authorization": MASK,
                      "nested": [{"PassWord": MASK, "api-key": MASK, "apiKey": MASK,
                                  "access_token": MASK, "client_secret": MASK}],
                      "max_tokens": 5, "tokenizer": "bpe"}
    assert "/Authorization" in paths and "/nested/0/access_token" in paths


def test_always_masked_names() -> None:
    for key in ("authorization", "PASSWORD", "secret", "Token", "api_key", "API-KEY"):
        assert is_always_masked(key), key
    for key in ("max_tokens", "secretary_name", "author"):
        assert not is_always_masked(key), key


def _reference(doc: Any, path: str, found: list[str]) -> Any:
    """Always-masked keys, the obvious way: a full copy with every pointer built."""
    if isinstance(doc, dict):
        out = {}
        for key, value in doc.items():
            child = path + "/" + key.replace("~", "~0").replace("/", "~1")
            if is_always_masked(key):
                if value != MASK:
                    found.append(child)
                out[key] = MASK
            else:
                out[key] = _reference(value, child, found)
        return out
    if isinstance(doc, list):
        return [_reference(v, f"{path}/{i}", found) for i, v in enumerate(doc)]
    return doc


_keys = st.sampled_from(["a", "token", "x/y", "m~n", "Api-Key", "client_secret", "0", ""])
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=3)
                     | st.just(MASK),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(_keys, inner, max_size=4), max_leaves=20)


@given(_json)
def test_always_masked_keys_match_a_full_copy_walk_and_leave_the_input_alone(doc: Any) -> None:
    before = copy.deepcopy(doc)
    found: list[str] = []
    expected = _reference(doc, "", found)
    masked, paths = mask_with_paths(doc)
    assert masked == expected and paths == sorted(set(found))
    assert doc == before

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


# The walk is skipped when the document's JSON text proves no key is always-masked
# (masking._no_masked_keys): the result must stay the walk's, byte for byte.
_tricky_keys = st.one_of(
    _keys,
    st.sampled_from(["TOKEN", "To\u212aen", "api_\u212aey", "AUTHORİZATION", "pass-word",
                     "a_p_i-k_e_y", "my_Token", "x-api-key", "secretive", "tok\"en",
                     "tok\\en", "tok\nen", "se\u00e7ret", "pässword", "Σ_token", "ﬆoken",
                     "\U0001f600_secret", "note", "amount_minor", "order_id"]),
    st.text(alphabet=st.sampled_from("tokenTOKEN_-apiKEYsecrt\u212a\u0130\u00e9\"\\ \x01"),
            max_size=8),
    st.text(max_size=6))
_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=4) | st.just(MASK),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_tricky_keys, inner,
                                                                  max_size=4),
    max_leaves=25)
_pointers = st.lists(st.sampled_from(["", "/a", "/token", "/0", "/a/0", "/x~1y", "/zz"]),
                     max_size=2)


@given(_values, _pointers)
def test_the_text_proof_never_changes_what_is_masked(doc: Any, pointers: list[str]) -> None:
    from cosigner.audit import masking

    before = copy.deepcopy(doc)
    expected_doc, expected_found = doc, []
    for pointer in pointers:  # mask_with_paths without the proof: pointers, then the walk
        expected_doc, hit = masking._mask_pointer(expected_doc, pointer)
        if hit:
            expected_found.append(pointer)
    expected_doc = masking._mask_keys(expected_doc, [], expected_found)
    masked, paths = mask_with_paths(doc, pointers)
    assert masked == expected_doc and paths == sorted(set(expected_found))
    assert type(masked) is type(expected_doc)
    value = mask_value(doc, pointers)  # the same document, by its own shorter path
    assert value == masked and type(value) is type(masked)
    assert (value is doc) == (masked is doc)
    assert doc == before
    if masking._no_masked_keys(doc):  # the proof holds only where the walk finds nothing
        assert masking._mask_keys(doc, [], []) is doc


def test_only_two_characters_lowercase_into_ascii() -> None:
    from cosigner.audit import masking

    found = "".join(c for c in map(chr, range(0x80, 0x110000))
                    if any(ord(x) < 0x80 for x in c.lower()))
    assert found == "\u0130\u212a"
    assert masking._LOWERS_TO_ASCII.findall(found) == list(found)


def test_keys_that_lowercase_into_a_masked_name_are_masked_without_a_walk_shortcut() -> None:
    for key in ("To\u212aen", "api_\u212aey", "x-api-\u212aey", "my_TO\u212aEN"):
        assert is_always_masked(key)
        masked, paths = mask_with_paths({"a": [{key: "v", "b": 1}]})
        assert masked == {"a": [{key: MASK, "b": 1}]}, key
        assert paths == [f"/a/0/{key}"]

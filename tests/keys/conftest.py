"""Fixtures of the key tests."""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from typing import Any

import pytest

from cosigner.keys.ed25519 import _nacl_aead


@pytest.fixture
def without_pynacl(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``import nacl…`` raises ImportError for the rest of the test (cryptography alone)."""
    real_import = builtins.__import__

    def no_nacl(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("nacl"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_nacl)
    _nacl_aead.cache_clear()  # the AES-GCM choice is remembered per process
    yield
    _nacl_aead.cache_clear()

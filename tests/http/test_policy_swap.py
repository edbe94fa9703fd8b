"""Reload/activation under concurrent decisions never mixes versions in one decision:
the version a decision records is the version whose rule decided it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.conftest import decision_request


def _version(root: Path, version: str) -> None:
    folder = root / f"swap-{version}"
    folder.mkdir(parents=True)
    (folder / "manifest.toml").write_text(
        f'id = "swap"\nversion = "{version}"\nengine = "python"\nentrypoint = "decide"\n'
        'tenants = ["*"]\n')
    (folder / "rules.py").write_text(
        "def decide(input):\n"
        f"    return {{'effect': 'allow', 'reasons': ['decided_by_{version}']}}\n")


async def test_concurrent_activations_never_mix_versions(harness_factory: Any, tmp_path: Path,
                                                         tenant: str) -> None:
    root = tmp_path / "bundles"
    _version(root, "1")
    _version(root, "2")
    h = await harness_factory(bundle_dirs=[root])
    store = h.context.store
    headers = await h.headers(tenant, "runtime")
    stop = asyncio.Event()

    async def flip() -> int:
        flips = 0
        while not stop.is_set():
            store.set_active("swap", "1" if flips % 2 else "2")
            flips += 1
            await asyncio.sleep(0)
        return flips

    flipper = asyncio.create_task(flip())
    responses = []
    for wave in range(8):  # waves, so both versions surely serve some decisions
        store.set_active("swap", "1" if wave % 2 else "2")
        responses += await asyncio.gather(*(
            h.client.post("/v1/decisions", headers=headers, json=decision_request())
            for _ in range(10)))
    stop.set()
    flips = await flipper
    assert flips > 10
    seen = set()
    for resp in responses:
        body = resp.json()
        assert resp.status_code == 200, body
        version = body["policy"]["version"]
        assert body["reasons"][0]["code"] == f"decided_by_{version}"
        seen.add(version)
    assert seen == {"1", "2"}  # both versions really served during the run

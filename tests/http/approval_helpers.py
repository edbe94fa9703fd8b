"""Factories shared by the approval and redeem API tests."""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from cosigner.core.clock import Clock
from tests.conftest import Harness, decision_request

FINANCE = {"require": [{"role": "finance", "count": 1}], "timeout_ms": 600_000,
           "distinct_from": "initiator_and_previous"}


def write_scripted_bundle(root: Path, *, review: bool = True,
                          rules: str = 'return input["context"]["result"]') -> Path:
    """A Python-rule bundle whose result is ``context.result`` (tests script the policy)."""
    folder = root / "scripted"
    folder.mkdir(parents=True, exist_ok=True)
    manifest = textwrap.dedent("""\
        id = "scripted"
        version = "1.0.0"
        engine = "python"
        entrypoint = "decide"
        tenants = ["*"]
    """)
    if review:
        manifest += textwrap.dedent("""\
            [review]
            require = [{ role = "finance", count = 1 }]
            timeout_ms = 600000
            distinct_from = "initiator_and_previous"
        """)
    (folder / "manifest.toml").write_text(manifest)
    (folder / "rules.py").write_text(f"def decide(input):\n    {rules}\n")
    return root


async def scripted_harness(harness_factory: Callable[..., Any], tmp_path: Path, *,
                           clock: Clock | None = None, **settings: Any) -> Harness:
    """A harness on the scripted bundle (:func:`write_scripted_bundle`, under
    ``tmp_path``), on ``clock`` when given, with ``settings`` overridden."""
    h: Harness = await harness_factory(
        clock=clock, bundle_dirs=[write_scripted_bundle(tmp_path / "b")], **settings)
    return h


def scripted(result: dict[str, Any], *, args: dict[str, Any] | None = None,
             tool: str = "delete_file", run: str | None = None, **overrides: Any
             ) -> dict[str, Any]:
    """A decision request whose policy result is ``result``."""
    return decision_request(
        run={"id": run or f"run-{uuid.uuid4().hex[:8]}"}, tool={"name": tool},
        args=args if args is not None else {"path": "/tmp/a"},
        context={"result": result}, **overrides)


def needs(*groups: tuple[str, int], timeout_ms: int = 600_000,
          distinct_from: str = "initiator_and_previous") -> dict[str, Any]:
    return {"effect": "require_approval", "reasons": ["scripted"],
            "approval": {"require": [{"role": r, "count": c} for r, c in groups],
                         "timeout_ms": timeout_ms, "distinct_from": distinct_from}}


async def decide(h: Harness, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    resp = await h.client.post("/v1/decisions", headers=headers, json=body)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


async def review(h: Harness, headers: dict[str, str], approval_id: str,
                 decision: str = "approved", comment: str = "ok",
                 **extra: Any) -> httpx.Response:
    return await h.client.post(f"/v1/approvals/{approval_id}/reviews", headers=headers,
                               json={"decision": decision, "comment": comment, **extra})


async def state(h: Harness, headers: dict[str, str], approval_id: str,
                **params: Any) -> dict[str, Any]:
    resp = await h.client.get(f"/v1/approvals/{approval_id}", headers=headers, params=params)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


async def redeem(h: Harness, headers: dict[str, str], token: str, tool: str,
                 args: dict[str, Any]) -> httpx.Response:
    return await h.client.post("/v1/permits/redeem", headers=headers,
                               json={"permit": token, "tool": tool, "args": args})


def refund_args(amount: int = 150_000) -> dict[str, Any]:
    return {"order_id": "ord_8472", "amount_minor": amount, "currency": "USD",
            "reason_code": "duplicate_charge"}

"""Seeding a decision log through the real decide path, for replay tests and the bench.

``seed`` runs ``n`` decisions in-process (``cosigner.decisions.pdp.decide``, the same
function the route calls) in concurrent chunks, so the group committer writes them in
large batches; it returns each decision's ``(request, response)``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

from cosigner.context import AppContext
from cosigner.decisions.pdp import DecisionRequest, decide
from cosigner.identity.principals import Caller

NEEDS = {"require": [{"role": "finance", "count": 1}], "timeout_ms": 600_000,
         "distinct_from": "initiator_and_previous"}

#: The live policy: small amounts allowed, middle ones reviewed, large ones denied.
LIVE = f"""
def decide(input):
    amount = input["args"]["amount"]
    if amount < 50:
        return {{"effect": "allow", "reasons": ["small"]}}
    if amount < 60:
        return {{"effect": "require_approval", "reasons": ["middle"], "approval": {NEEDS!r}}}
    return {{"effect": "deny", "reasons": ["large"]}}
"""

#: The candidate: refunds allowed up to 70, everything from 90 denied, the rest reviewed;
#: it raises (a candidate error) for the tool ``boom`` at amount 13; it reads the caller's
#: roles (so replaying a deny needs them).
CANDIDATE = f"""
def decide(input):
    amount = input["args"]["amount"]
    tool = input["tool"]["name"]
    if tool == "boom" and amount == 13:
        raise KeyError("boom")
    if "runtime" not in input["caller"]["roles"]:
        return {{"effect": "deny", "reasons": ["no_runtime"]}}
    if tool == "refund" and amount < 70:
        return {{"effect": "allow", "reasons": ["refund"]}}
    if amount >= 90:
        return {{"effect": "deny", "reasons": ["huge"]}}
    return {{"effect": "require_approval", "reasons": ["review"], "approval": {NEEDS!r}}}
"""

TOOLS = ("refund", "transfer", "boom")


def write_version(root: Path, bundle_id: str, version: str, rules: str,
                  tenants: list[str]) -> Path:
    """One Python bundle version in its own folder under ``root``."""
    folder = root / f"{bundle_id}-{version}"
    folder.mkdir(parents=True)
    (folder / "manifest.toml").write_text(
        f'id = "{bundle_id}"\nversion = "{version}"\nengine = "python"\n'
        f'entrypoint = "decide"\ntenants = {json.dumps(tenants)}\n')
    (folder / "rules.py").write_text(rules)
    return folder


def runtime_caller(tenant: str) -> Caller:
    return Caller(tenant=tenant, principal_id=str(uuid.uuid4()), subject="runtime-seed",
                  roles=frozenset({"runtime"}), kind="key")


def request(i: int, *, tool: str | None = None, args: dict[str, Any] | None = None
            ) -> DecisionRequest:
    body: dict[str, Any] = {
        "request_id": f"seed-{i}-{uuid.uuid4().hex[:8]}", "run": {"id": f"run-{i % 64}"},
        "principal": {"id": "customer-1", "type": "customer"},
        "initiator": {"id": "agent-1", "type": "agent"},
        "tool": {"name": tool or TOOLS[i % len(TOOLS)]},
        "args": args if args is not None else {"amount": (i * 7) % 100, "n": i},
        "context": {}}
    return DecisionRequest(request_id=body["request_id"], run=body["run"],
                           principal=body["principal"], initiator=body["initiator"],
                           tool=body["tool"], args=body["args"], context=body["context"],
                           raw=body)


async def seed(ctx: AppContext, caller: Caller, n: int, *, chunk: int = 1000
               ) -> list[tuple[DecisionRequest, dict[str, Any]]]:
    """``n`` decisions through the real decide path, ``chunk`` at a time concurrently."""
    out: list[tuple[DecisionRequest, dict[str, Any]]] = []
    for start in range(0, n, chunk):
        reqs = [request(i) for i in range(start, min(n, start + chunk))]
        answers = await asyncio.gather(*(decide(ctx, caller, r) for r in reqs))
        out.extend(zip(reqs, answers, strict=True))
    return out

"""The systems of a bench run: what serves, what wrk sends, what a correct answer is.

Each :class:`System` pairs a deployment (servers/databases) with a workload (a Lua
script under bench/lua, its arguments, the effect every answer must carry) and the
floor its ratio is taken against.
"""

from __future__ import annotations

import os
import tomllib
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.servers import (
    ROOT,
    CosignerDeployment,
    Deployment,
    FloorDeployment,
    LeanProtoDeployment,
    PeerDeployment,
    SeededCosignerDeployment,
    SetupError,
    post_json,
)
from bench.wrkrun import run_wrk

ALLOW_AMOUNT = "5000"
#: Decisions already in the log of ``allow-py-1m`` (``BENCH_SEED_DECISIONS``).
SEEDED = int(os.environ.get("BENCH_SEED_DECISIONS", "1000000"))
APPROVAL_AMOUNT = "150000"
#: Deployments holding an API key (``key``) that decide.lua sends as ``BENCH_KEY``.
KEYED = (CosignerDeployment, LeanProtoDeployment)
REDEEM_PATH = "/v1/permits/redeem"


def decision_body(amount: int, run_id: str = "run-probe") -> dict[str, Any]:
    """One DecisionRequest v1, the same call decide.lua sends."""
    return {
        "request_id": f"req-probe-{uuid.uuid4().hex}",
        "run": {"id": run_id, "step": 1},
        "principal": {"id": "customer-42", "type": "customer"},
        "initiator": {"id": "agent-support", "type": "agent"},
        "tool": {"name": "issue_refund", "side_effect": "financial"},
        "args": {"order_id": "ord_8472", "amount_minor": amount, "currency": "USD",
                 "reason_code": "duplicate_charge"},
        "context": {},
    }


@dataclass
class Workload:
    """What wrk sends. ``expect``: the effect every answer must carry (None: any)."""

    script: str
    expect: str | None

    def args(self, dep: Deployment, tag: str, connections: int, seconds: float
             ) -> list[str]:
        return []

    def per_url(self, args: list[str], index: int) -> list[str]:
        """The arguments of the wrk instance loading URL ``index`` (2-process systems)."""
        return args

    def env(self, dep: Deployment) -> dict[str, str]:
        return {}

    def probe(self, dep: Deployment) -> str:
        """Send one request from Python and check the answer; return a one-line note."""
        return ""

    def after_cell(self, connections: int, rps: float, requests: int) -> str:
        """Bookkeeping after a measured cell; returns a note for the table ('' if none)."""
        return ""


@dataclass
class FloorWorkload(Workload):
    script: str = "floor.lua"
    expect: str | None = "true"

    def probe(self, dep: Deployment) -> str:
        body = httpx.get(dep.urls[0] + "/", timeout=5).json()
        if body != {"ok": True}:
            raise SetupError(f"floor answered {body!r}")
        return ""


@dataclass
class PeerWorkload(Workload):
    script: str = "peer.lua"
    expect: str | None = "allow"

    def probe(self, dep: Deployment) -> str:
        url = dep.urls[0] + "/api/v1/policy/evaluate"
        seen = []
        for amount, want in ((5000, "allow"), (150000, "require_approval"),
                             (250000, "deny")):
            got = post_json(url, {"agent_did": "did:mesh:agent-support",
                                  "action": "issue_refund", "resource": "ord_8472",
                                  "context": {"amount_minor": amount, "currency": "USD"}}
                            ).json()["decision"]
            if got != want:
                raise SetupError(f"peer policy answered {got} for {amount}, want {want}")
            seen.append(f"{amount}→{got}")
        return "peer policy: " + ", ".join(seen)


@dataclass
class DecideWorkload(Workload):
    """POST /v1/decisions: ``mode`` allow (one run per wrk thread) or approval (one run
    per request). ``policy_id``: the bundle that must have decided (None: any)."""

    script: str = "decide.lua"
    expect: str | None = "allow"
    amount: str = ALLOW_AMOUNT
    mode: str = "allow"
    policy_id: str | None = None

    def args(self, dep: Deployment, tag: str, connections: int, seconds: float
             ) -> list[str]:
        return [tag, self.amount, self.mode]

    def per_url(self, args: list[str], index: int) -> list[str]:
        # Two wrk instances must never send the same request_id.
        return [f"{args[0]}p{index}", *args[1:]]

    def env(self, dep: Deployment) -> dict[str, str]:
        assert isinstance(dep, KEYED)
        return {"BENCH_KEY": dep.key}

    def probe(self, dep: Deployment) -> str:
        assert isinstance(dep, KEYED)
        notes = []
        for url in dep.urls:
            answer = post_json(url + "/v1/decisions", decision_body(int(self.amount)),
                               dep.key)
            body = answer.json()
            if answer.status_code != 200 or body.get("effect") != self.expect:
                raise SetupError(f"probe got {answer.status_code}: {answer.text[:400]}")
            policy = body.get("policy", {})
            if self.policy_id and policy.get("id") != self.policy_id:
                raise SetupError(f"decided by bundle {policy.get('id')!r}, "
                                 f"want {self.policy_id!r}")
            if self.expect == "allow" and not (body.get("permit") or {}).get("token"):
                raise SetupError("allow without a permit token")
            notes.append(f"{policy.get('id')}@{policy.get('version')}")
        return "policy " + ", ".join(sorted(set(notes)))


@dataclass
class RedeemWorkload(Workload):
    """POST /v1/permits/redeem, each permit once. Before every wrk run it mints a pool
    of permits through the allow path (wrk + decide.lua in mint mode, not measured),
    sized from the redeem rate seen so far with a 100 % margin (the machine's speed
    drifts by half between rounds). A pool that still runs out shows as refused
    re-redeems (errors) and a note, never silently."""

    script: str = "redeem.lua"
    expect: str | None = None
    seen_rps: dict[int, float] = field(default_factory=dict)
    mint_rps: float = 0.0
    pool: int = 0

    def env(self, dep: Deployment) -> dict[str, str]:
        assert isinstance(dep, CosignerDeployment)
        return {"BENCH_KEY": dep.key}

    def probe(self, dep: Deployment) -> str:
        assert isinstance(dep, CosignerDeployment)
        url = dep.urls[0]
        paths = httpx.get(url + "/openapi.json", timeout=10).json().get("paths", {})
        if REDEEM_PATH not in paths:
            raise Skip(f"{REDEEM_PATH} does not exist yet")
        decided = post_json(url + "/v1/decisions", decision_body(int(ALLOW_AMOUNT)),
                            dep.key).json()
        token = decided["permit"]["token"]
        body = {"permit": token, "tool": "issue_refund",
                "args": decision_body(int(ALLOW_AMOUNT))["args"]}
        first = post_json(url + REDEEM_PATH, body, dep.key)
        if first.status_code != 200:
            raise SetupError(f"redeem probe got {first.status_code}: {first.text[:400]}")
        again = post_json(url + REDEEM_PATH, body, dep.key)
        if again.status_code == 200:
            raise SetupError("a permit was redeemed twice")
        return f"redeem 200, second redeem {again.status_code} {again.json().get('code')}"

    def args(self, dep: Deployment, tag: str, connections: int, seconds: float
             ) -> list[str]:
        assert isinstance(dep, CosignerDeployment)
        tokens = dep.workdir / f"tokens-{tag}.txt"
        tokens.write_text("")
        rate = self.seen_rps.get(connections)
        target: float | None = None
        self.pool = 0
        for attempt in range(8):
            # First chunk 1.5 cells long; then what is missing at the rate seen, +20 %.
            chunk = 1.5 * seconds if target is None else \
                1.2 * (target - self.pool) / max(self.mint_rps, 1.0)
            minted = run_wrk(dep.urls, "decide.lua", connections=16,
                             seconds=max(2.0, chunk),
                             args=lambda i, a=attempt: [f"mint{tag}x{a}", ALLOW_AMOUNT,
                                                        "allow"],
                             env={"BENCH_KEY": dep.key,
                                  "BENCH_MINT_FILE": str(dep.workdir / f"permits-{tag}")})
            self.mint_rps = minted.rps
            with tokens.open("a") as out:
                for part in sorted(dep.workdir.glob(f"permits-{tag}.*")):
                    out.write(part.read_text())
                    part.unlink()
            self.pool = sum(1 for _ in tokens.open())
            if target is None:
                # Redeems needed: the cell at the redeem rate seen so far (else three
                # times the mint rate: a redeem costs less than half an allow since
                # they run on the raw driver), a 100 % margin (one round to the next
                # has run 50 % faster here), plus the requests in flight when wrk stops.
                target = 2.0 * (rate or 3 * minted.rps) * seconds + 4 * connections + 20
            if self.pool >= target:
                break
        if self.pool == 0:
            raise SetupError(f"minting permits failed: {minted.errors} {minted.bad_body}")
        return [str(tokens), str(min(2, connections))]

    def after_cell(self, connections: int, rps: float, requests: int) -> str:
        self.seen_rps[connections] = rps
        # Each wrk thread takes every n-th line: one thread may run out a little before
        # the whole pool does, so the margin of a connection per thread counts too.
        if requests + connections > self.pool:
            return f"permit pool exhausted ({requests} redeems, {self.pool} permits)"
        return ""


class Skip(Exception):
    """The system cannot be measured in this tree (a feature has not landed)."""


@dataclass
class System:
    name: str
    what: str
    deployment: Deployment
    workload: Workload
    floor: str | None
    skip: str | None = None
    failed: str | None = None
    notes: list[str] = field(default_factory=list)
    rss_mb: float = 0.0
    #: PostgreSQL systems: {connections: [(postgres CPU s, requests) per round]}.
    pg_cpu_s: dict[int, list[tuple[float, int]]] = field(default_factory=dict)


def rego_tenant() -> tuple[str | None, str]:
    """The tenant the Rego refund bundle is mapped to, and its bundle id."""
    manifest = ROOT / "rego" / "refunds" / "manifest.toml"
    if not manifest.exists():
        return None, ""
    data = tomllib.loads(manifest.read_text())
    tenants = [t for t in data.get("tenants", []) if t != "*"]
    return (tenants[0] if tenants else None), str(data.get("id", ""))


def all_systems() -> list[System]:
    tenant, rego_id = rego_tenant()
    systems = [
        System("floor", "bare FastAPI GET returning a constant, 1 uvicorn process",
               FloorDeployment("floor"), FloorWorkload(), None),
        System("allow-py", "POST /v1/decisions allow (Python rules), SQLite, 1 process",
               CosignerDeployment("allow-py", tenant="bench"), DecideWorkload(), "floor"),
        System("allow-py-1m", f"allow-py on a log already holding {SEEDED:,} allow "
               "decisions (bench/storage.py, real decide path)",
               SeededCosignerDeployment("allow-py-1m", tenant="bench", decisions=SEEDED),
               DecideWorkload(), "floor"),
        System("allow-rego", f"POST /v1/decisions allow (Rego bundle {rego_id}), SQLite, "
               "1 process", CosignerDeployment("allow-rego", tenant=tenant or "rego-demo"),
               DecideWorkload(policy_id=rego_id or None), "floor"),
        System("approval", "POST /v1/decisions require_approval (150000, a new run per "
               "request), SQLite, 1 process", CosignerDeployment("approval", tenant="bench"),
               DecideWorkload(expect="require_approval", amount=APPROVAL_AMOUNT,
                              mode="approval"), "floor"),
        System("approval-join", "POST /v1/decisions require_approval (150000) repeated "
               "in one run per wrk thread: each joins the open approval request of its "
               "run, tool and args, SQLite, 1 process",
               CosignerDeployment("approval-join", tenant="bench"),
               DecideWorkload(expect="require_approval", amount=APPROVAL_AMOUNT,
                              mode="join"), "floor"),
        System("redeem", "POST /v1/permits/redeem of pre-minted permits, SQLite, 1 process",
               CosignerDeployment("redeem", tenant="bench"), RedeemWorkload(), "floor"),
        System("lean-proto", "issue 20's study design rebuilt: POST /v1/decisions allow "
               "as one raw ASGI callable (bench/lean_proto.py), SQLite, 1 process",
               LeanProtoDeployment("lean-proto", tenant="bench"), DecideWorkload(), "floor"),
        System("peer", "agentmesh policy-server (Agent Governance Toolkit), refund policy "
               "in its YAML, 1 process", PeerDeployment("peer"), PeerWorkload(), "floor"),
        System("floor-2p", "bare FastAPI floor, 2 processes (2 ports, 2 wrk)",
               FloorDeployment("floor-2p", processes=2), FloorWorkload(), None),
        System("allow-pg-2p", "POST /v1/decisions allow (Python rules), PostgreSQL, "
               "2 processes (2 ports, 2 wrk)",
               CosignerDeployment("allow-pg-2p", tenant="bench", database="postgres",
                                  processes=2), DecideWorkload(), "floor-2p"),
    ]
    if tenant is None:
        rego = next(s for s in systems if s.name == "allow-rego")
        rego.skip = ("rego/refunds/manifest.toml not found or maps no tenant"
                     if not rego_id else "the Rego bundle maps no tenant")
    return systems


def selected(names: str | None) -> list[System]:
    """All systems, or those named (comma-separated) plus the floors their ratios need."""
    systems = all_systems()
    if not names:
        return systems
    wanted = {n.strip() for n in names.split(",") if n.strip()}
    unknown = wanted - {s.name for s in systems}
    if unknown:
        raise SystemExit(f"unknown system(s) {sorted(unknown)}; "
                         f"choose from {[s.name for s in systems]}")
    wanted |= {s.floor for s in systems if s.name in wanted and s.floor}
    return [s for s in systems if s.name in wanted]

"""``cosigner demo``: the reference support-refund run, end to end, through the client.

Order 8472 was charged twice. A support agent reads the order, its payment events and
the refund status (each ``allow``: decide → redeem → run → report), then asks to refund
200000 minor units: ``require_approval`` (finance). A demo finance approver approves over
the API (``--interactive``: the command prints the web form's URL and waits for a
person); the permit is redeemed and the refund runs exactly once. Replaying the permit,
changing the amount and asking for 250000 are each refused; finally the audit export is
verified offline (hash chain + signed checkpoints).

Without ``--url`` it starts ``cosigner serve`` on a temporary SQLite database on a free
loopback port (keys created directly in that database); with ``--url`` it needs keys for
an existing tenant (``--runtime-key``, ``--finance-key``, ``--auditor-key`` or the
``COSIGNER_DEMO_*_KEY`` variables). One line per gate; exit 1 if any expectation fails.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosigner.core.settings import Settings

ORDER_ID = "ord_8472"
REFUND: dict[str, Any] = {"order_id": ORDER_ID, "amount_minor": 200000, "currency": "USD",
          "reason_code": "duplicate_charge"}
#: the source tree (cosigner/cli/demo.py → repository root): bundles, and the cwd of the
#: demo server so it runs this same package
ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- stand-in


@dataclass
class RefundService:
    """A small local stand-in for the payment provider (in-process)."""

    refunds: list[dict[str, Any]] = field(default_factory=list)

    def get_order(self, order_id: str) -> dict[str, Any]:
        return {"order_id": order_id, "total_minor": 200000, "currency": "USD",
                "customer": "customer-42"}

    def get_payment_events(self, order_id: str) -> list[dict[str, Any]]:
        return [{"type": "charge", "amount_minor": 200000, "id": "ch_1"},
                {"type": "charge", "amount_minor": 200000, "id": "ch_2"}]

    def get_refund_status(self, order_id: str) -> dict[str, Any]:
        return {"order_id": order_id, "refunded_minor": sum(
            r["amount_minor"] for r in self.refunds if r["order_id"] == order_id)}

    def issue_refund(self, order_id: str, amount_minor: int, currency: str,
                     reason_code: str) -> dict[str, Any]:
        refund = {"refund_id": f"re_{len(self.refunds) + 1}", "order_id": order_id,
                  "amount_minor": amount_minor, "currency": currency}
        self.refunds.append(refund)
        return refund


# ----------------------------------------------------------------------------- output


class Story:
    """Prints one line per gate and collects failed expectations."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def line(self, gate: str, tool: str, effect: str, reason: str = "", policy: Any = None,
             args_hash: str | None = None, extra: str = "") -> None:
        version = f"{policy['id']}@{policy['version']}" if isinstance(policy, dict) else "-"
        digest = (args_hash or "")[7:19]
        print(f"{gate:<8} {tool:<19} {effect:<17} {reason:<22} {version:<14} "
              f"{digest + '…' if digest else '':<14} {extra}".rstrip(), flush=True)

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)
            print(f"  ✗ expected {what}", flush=True)

    def note(self, text: str) -> None:
        print(f"         {text}", flush=True)


def _progress(approval: Any) -> str:
    if approval is None:
        return ""
    groups = [f"{g.get('role')} {g.get('approved', 0)}/{g.get('count')}"
              for g in approval.progress] if approval is not None else []
    return f"approval {approval.status}" + (f" ({', '.join(groups)})" if groups else "")


# ----------------------------------------------------------------------------- server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bundle_dirs(settings: Settings) -> list[Path]:
    dirs = [p.resolve() for p in settings.bundle_dirs if p.resolve().is_dir()]
    return dirs or [d for d in (ROOT / "policies", ROOT / "rego") if d.is_dir()]


async def _prepare(url: str, tenant: str) -> dict[str, str]:
    from cosigner.core.clock import system_clock
    from cosigner.db.database import Database
    from cosigner.db.migrate import upgrade
    from cosigner.identity.principals import create_api_key

    await upgrade(url)
    db = Database(url)
    try:
        keys = {}
        for name, roles in (("runtime", ["runtime"]), ("finance", ["finance"]),
                            ("auditor", ["auditor"])):
            keys[name], _ = await create_api_key(db, tenant=tenant, roles=roles,
                                                 subject=f"demo-{name}", clock=system_clock)
        return keys
    finally:
        await db.dispose()


@contextmanager
def local_server(settings: Settings, tenant: str) -> Iterator[tuple[str, dict[str, str]]]:
    """``cosigner serve`` on a temporary SQLite database; yields (url, keys)."""
    with tempfile.TemporaryDirectory(prefix="cosigner-demo-") as tmp:
        db_url = f"sqlite+aiosqlite:///{tmp}/demo.db"
        keys = asyncio.run(_prepare(db_url, tenant))
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        dirs = ", ".join(f'"{d}"' for d in _bundle_dirs(settings))
        env = {**os.environ, "COSIGNER_DATABASE_URL": db_url,
               "COSIGNER_KEY_DIR": f"{tmp}/keys", "COSIGNER_BUNDLE_DIRS": f"[{dirs}]",
               "COSIGNER_PUBLIC_URL": url, "COSIGNER_LOG_LEVEL": "warning"}
        proc = subprocess.Popen([sys.executable, "-m", "cosigner", "serve", "--port",
                                 str(port), "--no-migrate"], env=env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _wait_ready(url, proc)
            yield url, keys
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    import httpx  # here, not at the top: `cosigner serve` imports this module

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            raise RuntimeError(f"server exited: {err}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server did not become ready in 30 s")


# ----------------------------------------------------------------------------- the run


def play(url: str, keys: dict[str, str], *, interactive: bool = False) -> int:
    """Play the refund run against ``url``; returns the exit code (0 = every expectation)."""
    import httpx
    from cosigner_client import Gate

    story = Story()
    service = RefundService()
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    print(f"Cosigner demo: order {ORDER_ID} was charged twice (server {url}, run {run_id})\n")
    print(f"{'gate':<8} {'tool':<19} {'effect':<17} {'reason':<22} {'policy':<14} "
          f"{'args hash':<14} detail")
    with Gate(url, keys["runtime"], principal={"id": "customer-42", "type": "customer"},
              initiator={"id": "agent-support", "type": "agent"}, timeout=5.0) as gate:
        run = gate.start_run(run_id, allowed_tools=[
            "get_order", "get_payment_events", "get_refund_status", "issue_refund"],
            tool_limits={"issue_refund": 3}, max_tool_calls=10, max_cost=500000)
        story.line("contract", "-", "registered", "", None, None,
                   f"{len(run.contract['allowed_tools'] or [])} tools, max 10 calls, "
                   f"budget 500000")
        for tool in ("get_order", "get_payment_events", "get_refund_status"):
            result = gate.call(tool, {"order_id": ORDER_ID}, getattr(service, tool),
                               side_effect="read")
            d = result.decision
            story.line("decide", tool, d.effect, d.reason, d.policy, d.args_hash)
            if result.redemption is not None:
                story.line("redeem", tool, result.redemption.code, "", None, d.args_hash,
                           f"permit {result.redemption.jti[:8]}…")
            if result.outcome is not None:
                story.line("report", tool, result.outcome.outcome, result.outcome.side_effect)
            story.expect(result.status == "executed", f"{tool} to be allowed and executed")

        decision = gate.decide("issue_refund", REFUND, side_effect="financial")
        story.line("decide", "issue_refund", decision.effect, decision.reason, decision.policy,
                   decision.args_hash, _progress(decision.approval))
        story.expect(decision.needs_approval and decision.approval is not None,
                     "a 200000 refund to need finance approval")
        if decision.approval is None:
            return _finish(story, service)
        if interactive:
            print(f"\n  Approve it in the web form: {decision.approval.review_url}\n"
                  "  (sign in as an approver holding the finance role; waiting up to 30 min)\n")
            approval = gate.wait_for_approval(decision, timeout=1800)
        else:
            review = httpx.post(f"{url}/v1/approvals/{decision.approval.id}/reviews",
                                headers={"Authorization": f"Bearer {keys['finance']}"},
                                json={"decision": "approved",
                                      "comment": "duplicate charge ch_2 confirmed"},
                                timeout=10)
            story.line("review", "issue_refund", "approved" if review.is_success else
                       f"HTTP {review.status_code}", "", None, None, "by demo-finance (API)")
            approval = gate.wait_for_approval(decision, timeout=10)
        story.line("wait", "issue_refund", approval.status, "", None, None, _progress(approval))
        story.expect(approval.approved, "the approval to be granted with a permit")
        if approval.permit is None:
            return _finish(story, service)

        redemption = gate.redeem(approval.permit, "issue_refund", REFUND)
        story.line("redeem", "issue_refund", redemption.code, "", None, decision.args_hash,
                   f"permit {approval.permit.jti[:8]}…")
        story.expect(redemption.ok, "the permit to redeem")
        if redemption.ok:
            refund = service.issue_refund(**REFUND)
            story.note(f"refund {refund['refund_id']} of {refund['amount_minor']} "
                       f"{refund['currency']} executed")
            report = gate.report_outcome(decision, "ok", "committed", cost_minor=200000)
            story.line("report", "issue_refund", report.outcome, report.side_effect, None,
                       None, "cost 200000" if report.ok else f"not recorded: {report.error}")
            story.expect(report.ok, "the outcome to be recorded")

        replay = gate.redeem(approval.permit, "issue_refund", REFUND)
        story.line("redeem", "issue_refund", replay.code, "replayed permit")
        story.expect(not replay.ok and replay.code == "already_redeemed",
                     "a replayed permit to be refused (already_redeemed)")
        changed = {**REFUND, "amount_minor": 150000}
        mutated = gate.redeem(approval.permit, "issue_refund", changed)
        story.line("redeem", "issue_refund", mutated.code, "amount changed")
        story.expect(not mutated.ok and mutated.code == "args_mismatch",
                     "a changed amount to be refused (args_mismatch)")
        greedy = gate.decide("issue_refund", {**REFUND, "amount_minor": 250000},
                             side_effect="financial")
        story.line("decide", "issue_refund", greedy.effect, greedy.reason, greedy.policy,
                   greedy.args_hash, "asked 250000")
        story.expect(greedy.effect == "deny", "a 250000 refund to be denied")
    _verify_audit(url, keys["auditor"], story)
    return _finish(story, service)


def _verify_audit(url: str, auditor_key: str, story: Story) -> None:
    import httpx

    from cosigner.audit.verify import verify_export

    headers = {"Authorization": f"Bearer {auditor_key}"}
    export = httpx.get(f"{url}/v1/audit/export", headers=headers, timeout=30)
    jwks = httpx.get(f"{url}/.well-known/jwks.json", timeout=10)
    if export.status_code != 200 or jwks.status_code != 200:
        story.line("audit", "-", f"HTTP {export.status_code}")
        story.expect(False, "the audit export to be available")
        return
    lines = export.text.split("\n")  # LF only: RFC 8785 leaves U+2028 etc. raw in strings
    report = verify_export(lambda: iter(lines), jwks.json())
    detail = (f"{report.events} events, {report.checkpoints} signed checkpoints"
              if report.ok else f"{report.fault} at seq {report.bad_seq}")
    story.line("audit", "-", "verified" if report.ok else "FAULT", "", None, None, detail)
    story.expect(report.ok, "the audit export to verify")


def _finish(story: Story, service: RefundService) -> int:
    story.expect(len(service.refunds) == 1, "exactly one refund executed")
    print()
    if story.failures:
        print(f"demo FAILED: {len(story.failures)} expectation(s) not met")
        return 1
    print(f"demo ok: {len(service.refunds)} refund executed, every refusal held, "
          "audit log verified")
    return 0


# ----------------------------------------------------------------------------- CLI


def demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="use a running server instead of starting one")
    p.add_argument("--interactive", action="store_true",
                   help="print the approval's web form URL and wait for a person")
    for name in ("runtime", "finance", "auditor"):
        p.add_argument(f"--{name}-key", default=os.environ.get(
            f"COSIGNER_DEMO_{name.upper()}_KEY"), help=f"{name} API key (with --url)")


def demo_cmd(args: argparse.Namespace, settings: Settings) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per gate, not per request
    if args.url:
        keys = {n: getattr(args, f"{n}_key") for n in ("runtime", "finance", "auditor")}
        missing = [n for n, k in keys.items() if not k]
        if missing:
            print(f"error: with --url pass --{'-key, --'.join(missing)}-key", file=sys.stderr)
            return 2
        return play(args.url.rstrip("/"), keys, interactive=args.interactive)
    with local_server(settings, tenant="demo") as (url, keys):
        return play(url, keys, interactive=args.interactive)

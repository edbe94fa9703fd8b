"""Replay logged decisions against a candidate bundle (impact analysis before activation).

The candidate is evaluated on the stored input of each ``decision.made`` event of one
tenant in ``[since, until)``; nothing is written but the summary event
(``policy.replayed``, :func:`record_replay`). What is replayed, from where:

* ``allow`` / ``require_approval``: the policy input stored for redeem (``call_inputs``:
  args masked by the catalogue / policy paths and always-secret keys; run counters of a
  contracted run as they were), with ``now`` = the decision's time;
* ``deny``: the input rebuilt from the decision event (principal, initiator, run as sent,
  tool, masked args, context, the caller's subject and, since this release, its roles
  ``caller_roles``); a contracted run's live counters are not in the event.

Not replayed (counted, with example ids): decisions made before policy ran (run contract
refusals, a reviewer's standing rejection: ``decided_before_policy``), deny events that
lack the caller's roles (``caller_roles_not_logged``), allow / approval decisions whose
stored input is gone (``input_not_stored``), decisions whose ``decision.made`` event does
not read back (rows deleted or damaged outside Cosigner: ``event_unreadable``, logged, the
decision id and tool taken from the event's row), and decisions whose outcome depends on a
masked value (``reads_masked_values``, naming the JSON pointers). A masked value counts as
read when substituting another value for it changes the candidate's effect or reason
codes; a rule that treats every substitute alike is replayed as such.

Memory is bounded: the log is read in keyset pages of ``page`` events (short read
transactions, never one long cursor), and only counters and at most
:data:`EXAMPLES` decision ids per group are kept.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select

from cosigner.audit.chain import Event
from cosigner.audit.query import utc
from cosigner.core import pointer as json_pointer
from cosigner.core.errors import InvalidArgs, InvalidRequest, NotFound
from cosigner.db import event_row
from cosigner.db.database import Database
from cosigner.db.tables import audit_events
from cosigner.db.tables_approvals import call_inputs
from cosigner.policy.admin import actor_of, authorize, loaded_version
from cosigner.policy.bundle import Bundle
from cosigner.policy.store import run_bundle
from cosigner.policy.tenancy import Fanout, is_operator

EXAMPLES = 5
#: ``not_replayed`` reason of a decision whose event does not read back.
UNREADABLE = "event_unreadable"
PAGE = 500
YIELD_EVERY = 50
#: Reasons set before policy runs (run contract, standing rejection): a candidate policy
#: would not have been asked.
PRE_POLICY = frozenset({"deadline_passed", "outside_contract", "budget_exhausted",
                        "rejected_by_reviewer"})
#: Reason codes that are the candidate's faults rather than its decisions.
CANDIDATE_ERRORS = frozenset({"policy_error", "undefined", "engine_unavailable"})
_INPUT_KEYS = frozenset({"args", "context", "principal", "initiator", "run", "tool"})
#: Each event body, or a marker when it does not read.
_BODY = event_row.lenient(audit_events.c.body)
#: Substituted for a masked value to see whether the candidate reads it.
_PROBE = 0


@dataclass(frozen=True, slots=True)
class Logged:
    """One logged decision as replay sees it."""

    decision_id: str
    tool: str
    effect: str
    input: dict[str, Any] | None  # None: cannot be rebuilt (see ``missing``)
    masked: tuple[str, ...]  # JSON pointers into ``input`` holding the mask
    missing: str | None = None  # why it is not replayable before evaluation


@dataclass(frozen=True, slots=True)
class Outcome:
    effect: str
    codes: tuple[str, ...]
    message: str = ""


@dataclass
class _Group:
    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, decision_id: str) -> None:
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(decision_id)


@dataclass
class ReplayReport:
    """Counters of one replay; :meth:`as_dict` is the wire form."""

    decisions: int = 0
    replayed: int = 0
    changed: int = 0
    by_tool: dict[str, Counter[str]] = field(default_factory=dict)
    transitions: dict[tuple[str, str, str], _Group] = field(default_factory=dict)
    not_replayed: dict[str, _Group] = field(default_factory=dict)
    masked_read: Counter[str] = field(default_factory=Counter)
    errors: dict[tuple[str, str], _Group] = field(default_factory=dict)

    def add(self, logged: Logged, outcome: Outcome | None, reason: str | None,
            read: tuple[str, ...] = ()) -> None:
        self.decisions += 1
        tool = self.by_tool.setdefault(logged.tool, Counter())
        if outcome is None:
            self.not_replayed.setdefault(reason or "unknown", _Group()).add(logged.decision_id)
            self.masked_read.update(read)
            tool["not_replayed"] += 1
            return
        self.replayed += 1
        tool["replayed"] += 1
        for code in outcome.codes:
            if code in CANDIDATE_ERRORS:
                self.errors.setdefault((code, outcome.message[:300]), _Group()).add(
                    logged.decision_id)
                break
        if outcome.effect != logged.effect:
            self.changed += 1
            tool["changed"] += 1
            self.transitions.setdefault((logged.tool, logged.effect, outcome.effect),
                                        _Group()).add(logged.decision_id)

    def as_dict(self) -> dict[str, Any]:
        return {
            "decisions": self.decisions, "replayed": self.replayed, "changed": self.changed,
            "by_tool": {tool: {"replayed": c["replayed"], "changed": c["changed"],
                               "not_replayed": c["not_replayed"]}
                        for tool, c in sorted(self.by_tool.items())},
            "transitions": [{"tool": tool, "from": old, "to": new, "count": g.count,
                             "examples": g.examples}
                            for (tool, old, new), g in sorted(self.transitions.items())],
            "not_replayed": [{"reason": reason, "count": g.count, "examples": g.examples}
                             for reason, g in sorted(self.not_replayed.items())],
            "masked_values_read": dict(sorted(self.masked_read.items())),
            "errors": [{"code": code, "message": message, "count": g.count,
                        "examples": g.examples}
                       for (code, message), g in sorted(self.errors.items())],
        }


# -- reading the log ---------------------------------------------------------------------


def _split(pointer: str) -> list[str]:
    """The unescaped segments of an RFC 6901 pointer (``""``: none)."""
    return [json_pointer.unescape(s) for s in pointer[1:].split("/")] if pointer else []


def _masked_input_paths(payload: dict[str, Any]) -> tuple[str, ...]:
    """Pointers of the event payload's masked values that are also policy input paths."""
    paths = payload.get("masked_paths") or ()
    return tuple(p for p in paths if _split(p)[:1] and _split(p)[0] in _INPUT_KEYS)


def logged_decision(body: dict[str, Any], stored: dict[str, Any] | None) -> Logged:
    """The replayable form of one ``decision.made`` event body; ``stored``: its
    ``call_inputs`` input document (allow / require_approval), if any."""
    payload: dict[str, Any] = body.get("payload") or {}
    decision_id = str((body.get("subject") or {}).get("decision_id"))
    tool, effect = str(body.get("tool")), str(body.get("effect"))
    masked = _masked_input_paths(payload)

    def missing(reason: str) -> Logged:
        return Logged(decision_id, tool, effect, None, masked, reason)

    if any(r.get("code") in PRE_POLICY for r in payload.get("reasons") or ()):
        return missing("decided_before_policy")
    if effect != "deny":
        if stored is None:
            return missing("input_not_stored")
        return Logged(decision_id, tool, effect, {**stored, "now": body["time"]}, masked)
    roles = payload.get("caller_roles")
    if roles is None:
        return missing("caller_roles_not_logged")
    doc = {"tenant": body.get("tenant"), "principal": payload.get("principal"),
           "initiator": payload.get("initiator"),
           "caller": {"subject": (body.get("actor") or {}).get("subject"), "roles": roles},
           "tool": payload.get("tool"), "args": payload.get("args"),
           "context": payload.get("context", {}), "run": payload.get("run"),
           "now": body["time"]}
    return Logged(decision_id, tool, effect, doc, masked)


async def logged_decisions(db: Database, *, tenant: str, since: datetime | None,
                           until: datetime | None, page: int = PAGE
                           ) -> AsyncIterator[Logged]:
    """``tenant``'s ``decision.made`` events in ``[since, until)`` in chain order, one
    keyset page (``seq > last``) per short read transaction, with their stored inputs.
    An event that does not read back is yielded as not replayable (:data:`UNREADABLE`)."""
    last = 0
    while True:
        query = (select(audit_events.c.seq, audit_events.c.decision_id,
                        audit_events.c.effect, audit_events.c.tool, _BODY)
                 .where(audit_events.c.tenant == tenant,
                        audit_events.c.type == "decision.made", audit_events.c.seq > last)
                 .order_by(audit_events.c.seq).limit(page))
        if since is not None:
            query = query.where(audit_events.c.time >= utc(since))
        if until is not None:
            query = query.where(audit_events.c.time < utc(until))
        async with db.read() as conn:
            rows = (await conn.execute(query)).all()
            wanted = [r.decision_id for r in rows if r.effect != "deny"]
            stored: dict[str, Any] = {}
            if wanted:
                found = await conn.execute(
                    select(call_inputs.c.decision_id, call_inputs.c.input)
                    .where(call_inputs.c.tenant == tenant,
                           call_inputs.c.decision_id.in_(wanted)))
                stored = {r.decision_id: r.input for r in found}
        for row in rows:
            body = event_row.readable(row.body, tenant=tenant, seq=int(row.seq),
                                      reader="a policy replay")
            if body is None:  # counted as not replayed, never silently dropped
                yield Logged(str(row.decision_id), str(row.tool), str(row.effect), None, (),
                             UNREADABLE)
                continue
            yield logged_decision(body, stored.get(row.decision_id))
        if len(rows) < page:
            return
        last = int(rows[-1].seq)


# -- evaluating the candidate ---------------------------------------------------------------


async def evaluate_candidate(bundle: Bundle, input_doc: dict[str, Any]) -> Outcome:
    """What ``bundle`` decides on ``input_doc``, as decide() would: catalogue first
    (unknown tool → ``deny``; arguments failing the schema → ``invalid_args``, i.e. a
    422 with nothing evaluated), then the policy (faults become ``deny``)."""
    tool = str((input_doc.get("tool") or {}).get("name"))
    if bundle.catalogue is not None:
        spec = bundle.catalogue.lookup(tool)
        if spec is None:
            return Outcome("deny", ("unknown_tool",))
        try:
            spec.validate(input_doc.get("args"))
        except InvalidArgs as exc:
            return Outcome("invalid_args", ("invalid_args",), exc.detail)
    result = await run_bundle(bundle, input_doc)
    message = next((r.message for r in result.reasons if r.code in CANDIDATE_ERRORS), "")
    return Outcome(result.effect, tuple(r.code for r in result.reasons), message)


def _substituted(doc: dict[str, Any], paths: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: Any = json.loads(json.dumps(doc))
    for path in paths:
        parts = _split(path)
        target = out
        for part in parts[:-1]:
            target = target[int(part)] if isinstance(target, list) else target.get(part)
            if target is None:
                break
        else:
            last = parts[-1]
            if isinstance(target, list) and last.isdigit() and int(last) < len(target):
                target[int(last)] = value
            elif isinstance(target, dict) and last in target:
                target[last] = value
    result: dict[str, Any] = out
    return result


async def replay_one(bundle: Bundle, logged: Logged
                     ) -> tuple[Outcome | None, str | None, tuple[str, ...]]:
    """``(outcome, None, ())`` when replayed; ``(None, reason, masked paths read)`` when
    not (see the module docstring)."""
    if logged.input is None:
        return None, logged.missing, ()
    outcome = await evaluate_candidate(bundle, logged.input)
    if not logged.masked:
        return outcome, None, ()
    probe = await evaluate_candidate(bundle, _substituted(logged.input, logged.masked, _PROBE))
    if (probe.effect, probe.codes) == (outcome.effect, outcome.codes):
        return outcome, None, ()
    read = []
    for path in logged.masked:
        one = await evaluate_candidate(bundle, _substituted(logged.input, (path,), _PROBE))
        if (one.effect, one.codes) != (outcome.effect, outcome.codes):
            read.append(path)
    return None, "reads_masked_values", tuple(read or logged.masked)


async def replay(db: Database, bundle: Bundle, *, tenant: str, since: datetime | None,
                 until: datetime | None, page: int = PAGE) -> ReplayReport:
    """Evaluate ``bundle`` on ``tenant``'s logged decisions in ``[since, until)``;
    writes nothing (see :func:`record_replay`)."""
    report = ReplayReport()
    async for logged in logged_decisions(db, tenant=tenant, since=since, until=until,
                                         page=page):
        outcome, reason, read = await replay_one(bundle, logged)
        report.add(logged, outcome, reason, read)
        if report.decisions % YIELD_EVERY == 0:
            # Python rules evaluate synchronously: let the server's decisions through.
            await asyncio.sleep(0)
    return report


def summary(bundle: Bundle, report: ReplayReport, *, tenant: str,
            since: datetime | None, until: datetime | None) -> dict[str, Any]:
    """The wire form: the candidate, the window and the report."""
    return {"tenant": tenant, "candidate": bundle.ref(),
            "since": since.isoformat() if since else None,
            "until": until.isoformat() if until else None, **report.as_dict()}


async def record_replay(db: Database, *, actor: dict[str, Any], now: datetime,
                        result: dict[str, Any]) -> None:
    """Append one ``policy.replayed`` event (the summary) to the replayed tenant's chain
    and ``_system``: the only write of a replay."""
    fanout = Fanout()
    fanout.add(Event(type="policy.replayed", actor=actor, policy=result["candidate"],
                     payload=result), [result["tenant"]])
    async with db.transaction() as conn:
        await fanout.append(conn, now=now)


async def replay_version(*, store: Any, db: Database, caller: Any, now: datetime,
                         bundle_id: str, version: str, tenant: str | None,
                         since: datetime | None, until: datetime | None) -> dict[str, Any]:
    """Replay a loaded ``version`` of ``bundle_id`` over a tenant's logged decisions
    (``POST /v1/policies/{id}/replay``). Who may: as for activate
    (:func:`cosigner.policy.admin.authorize`); a tenant admin replays their own tenant's
    log, a system operator names ``tenant``.

    Raises:
        NotFound, Forbidden: see ``authorize``. PolicyError: version not loaded.
        InvalidRequest: an operator without ``tenant``, or an admin naming another tenant.
    """
    await authorize(store=store, db=db, caller=caller, now=now, action="replay",
                    bundle_id=bundle_id)
    bundle = loaded_version(store.snapshot, bundle_id, version)
    if is_operator(caller):
        if tenant is None:
            raise InvalidRequest("a system operator names the tenant to replay",
                                 code="tenant_required")
    elif tenant is not None and tenant != caller.tenant:
        raise NotFound("no such tenant")
    target = tenant or caller.tenant
    report = await replay(db, bundle, tenant=target, since=since, until=until)
    result = summary(bundle, report, tenant=target, since=since, until=until)
    await record_replay(db, actor=actor_of(caller), now=now, result=result)
    return result

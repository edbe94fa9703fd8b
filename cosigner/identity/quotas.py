"""Rate limits and quotas per credential and per tenant (settings ``rate_limits``).

Counted with sliding-window counters (the ``limits`` package's algorithm, computed in
:mod:`cosigner.identity.windows`; O(1) memory per key) in this process's memory: limits
are **per replica**; N replicas behind a balancer admit up to N times the configured rates.
Checked after authentication, so an unauthenticated flood costs one key lookup and counts
nowhere.

* every API request: the credential's (principal's) and the tenant's sustained rate
  (``*_per_s`` over 10 s) and burst (``*_burst`` in 1 s);
* ``POST /v1/decisions``: the tenant's ``decisions_per_min``;
* an approval request asked for (a ``require_approval`` decision, ``POST /v1/approvals``):
  the tenant's ``approvals_per_min``.

Past a limit: :class:`RateLimited` (429, ``retry_after`` = seconds until the refusing
window has room). Refusals are logged as ``request.refused`` events with code
``rate_limited``, aggregated so a flood writes a bounded number of events: per (tenant,
credential, limit) and window of ``rate_limit_log_window_s``, the first refusal is written
before its 429 is answered, and the window's total (``refused``) once it ended
(:meth:`Quotas.flush`, run by the background tasks). At most two events per key and window.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import NoReturn

from cosigner.audit.chain import Event, append
from cosigner.core.clock import Clock, isoformat
from cosigner.core.errors import CosignerError, RateLimited
from cosigner.core.settings import RateLimits, Settings
from cosigner.db.database import Database
from cosigner.identity.principals import Caller
from cosigner.identity.windows import Windows

log = logging.getLogger("cosigner.quotas")

SUSTAINED_WINDOW_S = 10


@dataclass
class _Tally:
    """Refusals of one (tenant, credential, limit) in the current log window."""

    started: float  # monotonic
    started_at: str  # UTC, for the event
    actor: dict[str, object]
    refused: int = 0


Counters = tuple[tuple[str, int, int], ...]  # (key, limit, expiry s) per Windows.hit_all
#: A refusing limit: (limit name, counter key, limit, expiry s).
Refused = tuple[str, str, int, int]


@dataclass(frozen=True, slots=True)
class _Plan:
    """The counters one credential's requests hit, each as (limit names, counters)."""

    request: tuple[tuple[str, ...], Counters]  # every API request
    decision: tuple[tuple[str, ...], Counters]  # a decision: the request's, then its quota


def _counters(named: list[tuple[str, tuple[str, int, int]]]
              ) -> tuple[tuple[str, ...], Counters]:
    return tuple(n for n, _ in named), tuple(c for _, c in named)


class Quotas:
    """The limiter of one process; see the module docstring for what is counted."""

    def __init__(self, settings: Settings, db: Database, clock: Clock) -> None:
        self._settings, self._db, self._clock = settings, db, clock
        self._windows = Windows()
        self._window_s = settings.rate_limit_log_window_s
        self._tallies: dict[tuple[str, str, str], _Tally] = {}
        self._plans: dict[tuple[str, str], _Plan] = {}  # (tenant, principal id) → plan

    def limits_for(self, tenant: str) -> RateLimits:
        """The tenant's limits (its own entry, else ``"*"``, else none)."""
        table = self._settings.rate_limits
        return table.get(tenant) or table.get("*") or RateLimits(
            credential_per_s=0, credential_burst=0, tenant_per_s=0, tenant_burst=0,
            decisions_per_min=0, approvals_per_min=0)

    def _plan(self, caller: Caller) -> _Plan:
        """The counters of ``caller``'s requests (built once per credential: the limits
        and counter keys depend only on its tenant and principal id)."""
        who = (caller.tenant, caller.principal_id)
        plan = self._plans.get(who)
        if plan is None:
            lim = self.limits_for(caller.tenant)
            credential = caller.tenant + "\x00c:" + caller.principal_id
            tenant = caller.tenant + "\x00t:"
            sustained = SUSTAINED_WINDOW_S
            request = [(name, (key, limit, expiry)) for name, key, limit, expiry in (
                ("credential_burst", credential, lim.credential_burst, 1),
                ("credential_per_s", credential, lim.credential_per_s * sustained, sustained),
                ("tenant_burst", tenant, lim.tenant_burst, 1),
                ("tenant_per_s", tenant, lim.tenant_per_s * sustained, sustained)) if limit]
            decision = [("decisions_per_min", (caller.tenant + "\x00d",
                                               lim.decisions_per_min, 60))]
            plan = _Plan(request=_counters(request), decision=_counters(
                request + decision if lim.decisions_per_min else request))
            if len(self._plans) >= 10_000:
                self._plans.clear()
            self._plans[who] = plan
        return plan

    async def admit(self, caller: Caller, *, decision: bool = False) -> None:
        """Count one API request of ``caller`` (its credential's and tenant's rates), and
        with ``decision`` also one decision (the tenant's per-minute quota), in that order; the
        first limit used up stops the count. Raises :class:`RateLimited`."""
        refused = self.count(caller, decision=decision)
        if refused is not None:
            await self.refuse(caller, refused)

    def count(self, caller: Caller, *, decision: bool = False) -> Refused | None:
        """:meth:`admit`'s count without its refusal (the rate-limit door calls it, and
        awaits :meth:`refuse` only past a limit): ``None`` when every limit admitted the
        request, else the limit that refused it."""
        plan = self._plan(caller)
        names, counters = plan.decision if decision else plan.request
        refused = self._windows.hit_all(counters)
        if refused < 0:
            return None
        return (names[refused], *counters[refused])

    async def refuse(self, caller: Caller, refused: Refused) -> NoReturn:
        """Record :meth:`count`'s refusal and raise :class:`RateLimited`."""
        await self._refuse(caller, *refused)

    async def count_approval(self, caller: Caller) -> None:
        """Count one approval request asked for against the tenant's per-minute quota."""
        n = self.limits_for(caller.tenant).approvals_per_min
        if n and not self._windows.hit(caller.tenant + "\x00a", n, 60):
            await self._refuse(caller, "approvals_per_min", caller.tenant + "\x00a", n, 60)

    async def _refuse(self, caller: Caller, name: str, key: str, limit: int,
                      expiry_s: int) -> NoReturn:
        """Record the refusal of one hit of ``key`` past ``limit`` per ``expiry_s`` and
        raise :class:`RateLimited` with ``retry_after`` (whole seconds, ≥ 1)."""
        retry_after = max(1, math.ceil(self._windows.reset_in(key, limit, expiry_s)))
        await self._record(caller, name)
        raise RateLimited(f"{name.replace('_', ' ')} limit of the "
                          f"{'credential' if name.startswith('credential') else 'tenant'} "
                          "is used up", retry_after=retry_after, limit=name)

    async def _record(self, caller: Caller, name: str) -> None:
        """Count one refusal; the first of its window is written now (durable before the
        429), the window's total by :meth:`flush`."""
        key = (caller.tenant, caller.principal_id, name)
        tally = self._tallies.get(key)
        now = time.monotonic()
        if tally is not None and now - tally.started >= self._window_s:
            await self._write(key, tally)
            tally = None
        if tally is not None:
            tally.refused += 1
            return
        tally = _Tally(started=now, started_at=isoformat(self._clock()),
                       actor=caller.actor(), refused=1)
        self._tallies[key] = tally
        await self._write_event(caller.tenant, tally.actor, name, first=True,
                                refused=1, started_at=tally.started_at)

    async def flush(self, *, everything: bool = False) -> int:
        """Write the total of every ended window (every window with ``everything``);
        returns how many events were written."""
        now = time.monotonic()
        written = 0
        for key, tally in list(self._tallies.items()):
            if everything or now - tally.started >= self._window_s:
                written += await self._write(key, tally)
        return written

    async def _write(self, key: tuple[str, str, str], tally: _Tally) -> int:
        self._tallies.pop(key, None)
        if tally.refused <= 1:
            return 0  # the first refusal's own event already says it all
        await self._write_event(key[0], tally.actor, key[2], first=False,
                                refused=tally.refused, started_at=tally.started_at)
        return 1

    async def _write_event(self, tenant: str, actor: dict[str, object], name: str, *,
                           first: bool, refused: int, started_at: str) -> None:
        event = Event(type="request.refused", actor=dict(actor), effect="refused", payload={
            "code": "rate_limited", "limit": name, "window_s": self._window_s,
            "window_started_at": started_at, "refused": refused,
            "aggregate": "first" if first else "window_total"})
        try:
            async with self._db.transaction() as conn:
                await append(conn, tenant, [event], now=self._clock())
        except CosignerError as exc:  # the 429 itself is what the caller gets
            log.error("could not record rate-limit refusals of %s: %s", tenant, exc.detail)


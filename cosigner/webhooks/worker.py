"""The delivery worker: claims due outbox rows, posts them, records every attempt.

Several replicas may run it: a row is claimed with a conditional update
(``claimed_until``), so only one replica sends a given attempt. A 2xx marks the delivery
``delivered``; anything else (status, timeout, refused connection) schedules a retry with
exponential backoff (2 s, 4 s, 8 s … capped at 15 min) until ``MAX_ATTEMPTS``, then
``failed``. Sending happens outside any transaction, so a slow receiver holds no lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import or_, select, update

from cosigner.core.clock import Clock, numeric_date
from cosigner.core.errors import CosignerError
from cosigner.core.metrics import metrics
from cosigner.core.settings import Settings
from cosigner.db.database import Database
from cosigner.db.tables_web import webhook_attempts, webhook_deliveries
from cosigner.webhooks import signing
from cosigner.webhooks.outbox import Backlog, targets

if TYPE_CHECKING:  # httpx (~5 MB) loads on the first delivery, not with the app
    import httpx

log = logging.getLogger("cosigner.webhooks")

MAX_ATTEMPTS = 10
BASE_DELAY_S = 2.0
MAX_DELAY_S = 900.0
CLAIM_S = 60
TIMEOUT_S = 5.0
BATCH = 20


def backoff_s(attempts: int) -> float:
    """Delay before the next attempt after ``attempts`` failed ones (s)."""
    return float(min(BASE_DELAY_S * 2 ** max(attempts - 1, 0), MAX_DELAY_S))


class WebhookWorker:
    """Deliver queued webhooks; :meth:`run_once` for tests, :meth:`start` in the app."""

    def __init__(self, db: Database, settings: Settings, clock: Clock, *,
                 poll_s: float = 1.0, transport: httpx.AsyncBaseTransport | None = None,
                 backlog: Backlog | None = None) -> None:
        self._db, self._settings, self._clock, self._poll_s = db, settings, clock, poll_s
        self.backlog = backlog or Backlog(settings.webhook_backlog_max)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None  # made on the first delivery
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="webhook-worker")

    async def stop_loop(self) -> None:
        """Stop polling (in-flight attempt included); :meth:`run_once` still works."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def stop(self) -> None:
        await self.stop_loop()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except CosignerError as exc:  # database unavailable: try again next tick
                log.warning("webhook worker: %s", exc.detail)
            except Exception:  # noqa: BLE001 - the worker must outlive one bad row
                log.exception("webhook worker failed")
            await asyncio.sleep(self._poll_s)

    async def run_once(self) -> int:
        """Count the backlog, then attempt every due delivery once; returns how many were
        attempted."""
        async with self._db.read() as conn:
            await self.backlog.count(conn)
        done = 0
        for row in await self._claim(self._clock()):
            await self._attempt(row)
            done += 1
        return done

    async def _claim(self, now: datetime) -> list[Any]:
        due = (webhook_deliveries.c.status == "pending") & (
            webhook_deliveries.c.next_attempt_at <= now) & or_(
            webhook_deliveries.c.claimed_until.is_(None),
            webhook_deliveries.c.claimed_until <= now)
        if "*" not in self._settings.webhooks:  # only tenants this process can sign for
            due = due & webhook_deliveries.c.tenant.in_(sorted(self._settings.webhooks))
        async with self._db.read() as conn:
            ids = (await conn.execute(select(webhook_deliveries.c.id).where(due)
                                      .order_by(webhook_deliveries.c.next_attempt_at)
                                      .limit(BATCH))).scalars().all()
        claimed = []
        for delivery_id in ids:
            async with self._db.transaction() as conn:
                won = (await conn.execute(update(webhook_deliveries).where(
                    webhook_deliveries.c.id == delivery_id, due).values(
                    claimed_until=now + timedelta(seconds=CLAIM_S)))).rowcount
                if won == 1:
                    claimed.append((await conn.execute(select(webhook_deliveries).where(
                        webhook_deliveries.c.id == delivery_id))).one())
        return claimed

    async def _attempt(self, row: Any) -> None:
        secret = next((t.secret.get_secret_value() for t in targets(self._settings, row.tenant)
                       if t.url == row.url), None)
        started = time.monotonic()
        status_code: int | None = None
        error: str | None = None
        if secret is None:
            error = "receiver no longer configured"
        else:
            body = row.body.encode()
            headers = {"content-type": "application/json", "user-agent": "cosigner-webhooks",
                       "cosigner-event": row.event_type, "cosigner-delivery": row.id,
                       signing.HEADER: signing.sign(secret, body,
                                                    timestamp=numeric_date(self._clock()))}
            import httpx

            if self._client is None:
                self._client = httpx.AsyncClient(timeout=TIMEOUT_S, transport=self._transport,
                                                 follow_redirects=False)
            try:
                response = await self._client.post(row.url, content=body, headers=headers)
                status_code = response.status_code
                if not 200 <= status_code < 300:
                    error = f"HTTP {status_code}"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {str(exc)[:200]}"
        await self._record(row, status_code, error, int((time.monotonic() - started) * 1000),
                           final=secret is None)

    async def _record(self, row: Any, status_code: int | None, error: str | None,
                      duration_ms: int, *, final: bool) -> None:
        now = self._clock()
        attempts = row.attempts + 1
        values: dict[str, Any] = {"attempts": attempts, "claimed_until": None}
        if error is None:
            values.update(status="delivered", delivered_at=now)
        elif final or attempts >= MAX_ATTEMPTS:
            values.update(status="failed")
            log.warning("webhook %s to %s failed for good: %s", row.id, row.url, error)
        else:
            values.update(next_attempt_at=now + timedelta(seconds=backoff_s(attempts)))
        async with self._db.transaction() as conn:
            await conn.execute(webhook_attempts.insert().values(
                delivery_id=row.id, attempt=attempts, at=now, status_code=status_code,
                error=error, duration_ms=duration_ms))
            await conn.execute(webhook_deliveries.update()
                               .where(webhook_deliveries.c.id == row.id).values(**values))
        metrics().webhooks[(str(values.get("status", "retry")),)].inc()

"""The Slack Web API as Cosigner uses it, through the official ``slack_sdk``.

One :class:`SlackApi` per call site and workspace, built from settings: the tenant's bot
token and ``settings.slack_api_url`` as the SDK's ``base_url`` (tests point it at a local
stand-in of the Web API; the real one is https://slack.com/api/). The SDK's own retries are
off: the outbox (:mod:`cosigner.slack.messages`) retries with its own backoff and claims.
Every SDK or transport failure becomes :class:`SlackCallFailed` here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cosigner.core.settings import Settings

#: Seconds one Web API call may take.
TIMEOUT_S = 10


class SlackCallFailed(Exception):
    """A Web API call that did not succeed: ``error`` is Slack's code (``channel_not_found``,
    ``ratelimited``, ``invalid_auth`` …) or the transport failure; ``retry_after_s`` the
    delay Slack asked for (HTTP 429 ``Retry-After``), if any."""

    def __init__(self, error: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(error)
        self.error = error[:200]
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class SlackApi:
    """Web API calls of one tenant's workspace."""

    token: str
    base_url: str

    @classmethod
    def for_tenant(cls, settings: Settings, tenant: str) -> SlackApi | None:
        """The tenant's API, or ``None`` when it has no Slack workspace configured."""
        workspace = settings.slack.get(tenant)
        if workspace is None:
            return None
        return cls(workspace.bot_token.get_secret_value(), settings.slack_api_url)

    async def call(self, method: str, **body: Any) -> dict[str, Any]:
        """POST ``method`` (``chat.postMessage`` …) with a JSON body; Slack's answer.

        Raises:
            SlackCallFailed: ``ok: false``, an HTTP error, a timeout or no connection.
        """
        # The SDK and aiohttp (~12 MB) load on a tenant's first Slack call, not with the app.
        import aiohttp
        from slack_sdk.errors import SlackApiError, SlackClientError
        from slack_sdk.web.async_client import AsyncWebClient

        client = AsyncWebClient(token=self.token, base_url=self.base_url,
                                timeout=TIMEOUT_S, retry_handlers=[])
        try:
            response = await client.api_call(method, json=body)
        except SlackApiError as exc:
            retry = exc.response.headers.get("retry-after") or exc.response.headers.get(
                "Retry-After")
            raise SlackCallFailed(str(exc.response.get("error") or exc.response.status_code),
                                  retry_after_s=float(retry) if retry else None) from exc
        except (TimeoutError, SlackClientError, aiohttp.ClientError, OSError) as exc:
            raise SlackCallFailed(f"{type(exc).__name__}: {exc}") from exc
        return dict(response.data) if isinstance(response.data, dict) else {}

    async def post_message(self, channel: str, text: str,
                           blocks: list[dict[str, Any]]) -> tuple[str, str]:
        """``chat.postMessage``; returns ``(channel id, ts)`` of the new message."""
        answer = await self.call("chat.postMessage", channel=channel, text=text, blocks=blocks,
                                 unfurl_links=False, unfurl_media=False)
        return str(answer["channel"]), str(answer["ts"])

    async def update_message(self, channel: str, ts: str, text: str,
                             blocks: list[dict[str, Any]]) -> None:
        """``chat.update`` of the message ``(channel, ts)``."""
        await self.call("chat.update", channel=channel, ts=ts, text=text, blocks=blocks)

    async def post_ephemeral(self, channel: str, user: str, text: str) -> None:
        """``chat.postEphemeral``: ``text`` seen by ``user`` only, in ``channel``."""
        await self.call("chat.postEphemeral", channel=channel, user=user, text=text)

    async def open_view(self, trigger_id: str, view: dict[str, Any]) -> None:
        """``views.open`` with the click's ``trigger_id`` (valid 3 s after the click)."""
        await self.call("views.open", trigger_id=trigger_id, view=view)

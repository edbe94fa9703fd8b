"""Step 1 of an interactivity request: Slack's signature, checked before the body is read.

``X-Slack-Request-Timestamp`` must be within :data:`MAX_SKEW_S` of now and
``X-Slack-Signature`` the ``v0=`` HMAC-SHA256 of ``v0:{timestamp}:{body}`` under a
configured signing secret
(https://docs.slack.dev/authentication/verifying-requests-from-slack/), checked with
``slack_sdk``'s :class:`SignatureVerifier` (constant-time comparison) on the app's clock.
"""

from __future__ import annotations

from collections.abc import Mapping

from cosigner.core.clock import Clock
from cosigner.core.settings import Settings

#: Slack's replay window (s): a request timestamp further from now is refused.
MAX_SKEW_S = 300


class SlackRefused(Exception):
    """An interactivity request refused before anything was done (``code``:
    ``slack_unsigned``, ``slack_stale``, ``slack_bad_signature``, ``slack_bad_payload``,
    ``slack_unknown_team``); ``status`` is the HTTP answer."""

    def __init__(self, code: str, detail: str, *, status: int = 401) -> None:
        super().__init__(detail)
        self.code, self.detail, self.status = code, detail, status


def verified_tenants(settings: Settings, clock: Clock, body: bytes,
                     headers: Mapping[str, str]) -> list[str]:
    """Tenants whose Slack signing secret signed ``body`` (one app may serve several).

    Raises:
        SlackRefused: ``slack_unsigned`` (a header missing), ``slack_stale`` (timestamp
            not an integer within :data:`MAX_SKEW_S` of now), ``slack_bad_signature``.
    """
    timestamp = headers.get("x-slack-request-timestamp")
    signature = headers.get("x-slack-signature")
    if not timestamp or not signature:
        raise SlackRefused("slack_unsigned", "the request is not signed by Slack")
    if not timestamp.isascii() or not timestamp.isdigit() or \
            abs(clock().timestamp() - int(timestamp)) > MAX_SKEW_S:
        raise SlackRefused("slack_stale", "the request timestamp is not within 5 minutes")
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        raise SlackRefused("slack_bad_signature", "the request signature does not match"
                           ) from None
    # slack_sdk loads with the first Slack request, not with the app (idle memory)
    from slack_sdk.signature import Clock as SlackClock
    from slack_sdk.signature import SignatureVerifier

    class AppClock(SlackClock):
        def now(self) -> float:
            return clock().timestamp()

    slack_clock = AppClock()
    tenants = [tenant for tenant, workspace in sorted(settings.slack.items())
               if SignatureVerifier(workspace.signing_secret.get_secret_value(), slack_clock)
               .is_valid(body, timestamp, signature)]
    if not tenants:
        raise SlackRefused("slack_bad_signature", "the request signature does not match")
    return tenants

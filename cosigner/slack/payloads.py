"""The shape of a signed Slack interaction, checked before anything acts on it.

Slack sends ``payload=<JSON>`` (https://docs.slack.dev/reference/interaction-payloads/).
Only the fields Cosigner reads are checked, and each must have the type Slack documents:
objects are objects, lists are lists, identifiers are strings. Anything else raises
:class:`~cosigner.slack.signatures.SlackRefused` ``slack_bad_payload`` (400), so a signed
body of an odd shape is a clean refusal, never a server error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from cosigner.slack import blocks
from cosigner.slack.links import SlackUser
from cosigner.slack.signatures import SlackRefused


@dataclass(frozen=True, slots=True)
class Interaction:
    """What Cosigner reads of one interaction.

    ``kind``: Slack's ``type`` (``block_actions``, ``view_submission``, ...);
    ``action_id``/``value``: the first action of a click; ``channel``: where the click
    happened (may be empty); ``trigger_id``: for opening the modal; ``callback_id``,
    ``metadata`` (the modal's ``private_metadata`` text) and ``reason`` (the reason field):
    of a submitted modal.
    """

    kind: str
    user: SlackUser
    action_id: str = ""
    value: str = ""
    channel: str = ""
    trigger_id: str = ""
    callback_id: str = ""
    metadata: str = ""
    reason: str = ""


def _bad(where: str) -> SlackRefused:
    return SlackRefused("slack_bad_payload",
                        f"the payload is not a Slack interaction ({where})", status=400)


def _obj(value: Any, where: str, *, required: bool = False) -> dict[str, Any]:
    """``value`` as an object; ``None`` is ``{}`` unless ``required``."""
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise _bad(f"{where} is not an object")
    return value


def _text(value: Any, where: str, *, required: bool = False, limit: int = 4000) -> str:
    """``value`` as a string (``None``: empty unless ``required``), at most ``limit``."""
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value) or len(value) > limit:
        raise _bad(f"{where} is not a string of at most {limit} characters")
    return value


def parse(body: bytes) -> Interaction:
    """The :class:`Interaction` of a form body already verified as Slack's.

    Raises:
        SlackRefused: ``slack_bad_payload`` (400) — no ``payload`` field, not JSON, or a
            field of the wrong type (module docstring).
    """
    try:
        fields = parse_qs(body.decode("utf-8"), max_num_fields=20)
        payload = _obj(json.loads(fields["payload"][0]), "payload", required=True)
    except (KeyError, IndexError, ValueError, RecursionError):
        raise _bad("no JSON payload field") from None
    person = _obj(payload.get("user"), "user", required=True)
    team = _text(_obj(payload.get("team"), "team").get("id"), "team.id") or \
        _text(person.get("team_id"), "user.team_id", required=True)
    user = SlackUser(team, _text(person.get("id"), "user.id", required=True, limit=32),
                     _text(person.get("username"), "user.username") or
                     _text(person.get("name"), "user.name"))
    kind = _text(payload.get("type"), "type", required=True, limit=64)
    if len(team) > 32:
        raise _bad("team.id is too long")
    if kind == "block_actions":
        actions = payload.get("actions")
        if not isinstance(actions, list) or not actions:
            raise _bad("actions is not a list of actions")
        action = _obj(actions[0], "actions[0]", required=True)
        return Interaction(kind, user,
                           action_id=_text(action.get("action_id"), "action_id", limit=255),
                           value=_text(action.get("value"), "action.value", limit=2000),
                           channel=_text(_obj(payload.get("channel"), "channel").get("id"),
                                         "channel.id", limit=80),
                           trigger_id=_text(payload.get("trigger_id"), "trigger_id"))
    if kind == "view_submission":
        view = _obj(payload.get("view"), "view", required=True)
        callback_id = _text(view.get("callback_id"), "view.callback_id", limit=255)
        if callback_id != blocks.REJECT:
            return Interaction(kind, user, callback_id=callback_id)
        values = _obj(_obj(view.get("state"), "view.state", required=True).get("values"),
                      "view.state.values", required=True)
        field = _obj(_obj(values.get(blocks.REASON_BLOCK), "reason block")
                     .get(blocks.REASON_ACTION), "reason field")
        return Interaction(kind, user, callback_id=callback_id,
                           metadata=_text(view.get("private_metadata"),
                                          "view.private_metadata"),
                           reason=_text(field.get("value"), "reason"))
    return Interaction(kind, user)

"""A local stand-in of the Slack Web API methods Cosigner calls (the real one cannot be
reached from here): a real HTTP server on loopback that records every call and answers
as https://docs.slack.dev/reference/methods documents, including its errors.

``chat.postMessage``, ``chat.update``, ``chat.postEphemeral`` and ``views.open`` check the
bearer token (``invalid_auth``), their required arguments (``channel_not_found``,
``message_not_found``, ``invalid_arguments``) and can be told to fail the next calls with
HTTP 429 ``ratelimited`` and ``Retry-After`` (Slack's rate-limit answer).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHANNEL_ID = "C0APPROVAL1"


@dataclass
class Call:
    method: str
    body: dict[str, Any]
    authorization: str


@dataclass
class SlackStandIn:
    token: str
    channels: dict[str, str] = field(default_factory=lambda: {
        "#approvals": CHANNEL_ID, CHANNEL_ID: CHANNEL_ID})
    calls: list[Call] = field(default_factory=list)
    messages: dict[str, dict[str, Any]] = field(default_factory=dict)  # ts -> message
    fail: dict[str, int] = field(default_factory=dict)  # method -> calls left to fail
    _seq: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                method = self.path.rsplit("/", 1)[-1]
                body = json.loads(raw or b"{}")
                status, answer, headers = standin.answer(
                    method, body, self.headers.get("authorization") or "")
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json; charset=utf-8")
                self.send_header("content-length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def of(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def answer(self, method: str, body: dict[str, Any], authorization: str
               ) -> tuple[int, dict[str, Any], dict[str, str]]:
        with self._lock:
            self.calls.append(Call(method, body, authorization))
            if authorization != f"Bearer {self.token}":
                return 200, {"ok": False, "error": "invalid_auth"}, {}
            if self.fail.get(method, 0) > 0:
                self.fail[method] -= 1
                return 429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "1"}
            handler = getattr(self, "_" + method.replace(".", "_"), None)
            if handler is None:
                return 200, {"ok": False, "error": "unknown_method"}, {}
            return 200, handler(body), {}

    def _ts(self) -> str:
        self._seq += 1
        return f"{int(time.time())}.{self._seq:06d}"

    def _chat_postMessage(self, body: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        channel = self.channels.get(str(body.get("channel")))
        if channel is None:
            return {"ok": False, "error": "channel_not_found"}
        if not body.get("text") and not body.get("blocks"):
            return {"ok": False, "error": "no_text"}
        ts = self._ts()
        message = {"type": "message", "text": body.get("text", ""),
                   "blocks": body.get("blocks", []), "ts": ts, "bot_id": "B0COSIGNER"}
        self.messages[ts] = message
        return {"ok": True, "channel": channel, "ts": ts, "message": message}

    def _chat_update(self, body: dict[str, Any]) -> dict[str, Any]:
        ts = str(body.get("ts"))
        if body.get("channel") not in self.channels.values():
            return {"ok": False, "error": "channel_not_found"}
        if ts not in self.messages:
            return {"ok": False, "error": "message_not_found"}
        self.messages[ts] = {**self.messages[ts], "text": body.get("text", ""),
                             "blocks": body.get("blocks", [])}
        return {"ok": True, "channel": body["channel"], "ts": ts,
                "text": body.get("text", ""), "message": self.messages[ts]}

    def _chat_postEphemeral(self, body: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        if body.get("channel") not in self.channels.values():
            return {"ok": False, "error": "channel_not_found"}
        if not body.get("user"):
            return {"ok": False, "error": "user_not_in_channel"}
        return {"ok": True, "message_ts": self._ts()}

    def _views_open(self, body: dict[str, Any]) -> dict[str, Any]:
        if not body.get("trigger_id"):
            return {"ok": False, "error": "invalid_trigger_id"}
        view = body.get("view") or {}
        if view.get("type") != "modal":
            return {"ok": False, "error": "invalid_arguments"}
        return {"ok": True, "view": {**view, "id": "V0MODAL1", "team_id": "T0ACME"}}

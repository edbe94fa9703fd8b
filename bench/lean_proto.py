"""The issue-20 study's lean allow path, rebuilt as one raw ASGI callable (bench system
``lean-proto``).

Issue 20 cites a study whose prototype of "exactly today's allow path" reached 0.56× /
0.70× the FastAPI floor (c=16 / c=64) as a raw ASGI callable on its machine; its code is
not available. This module rebuilds that design from the study's list, to measure on
this machine what the design reaches in the same ``bench/run.py`` run as the floor,
Cosigner and the peer. It is a benchmark system, not part of Cosigner: nothing under
``cosigner/`` imports it and it imports nothing from ``cosigner/``.

``POST /v1/decisions`` (the body bench/lua/decide.lua sends, a DecisionRequest v1) does,
in this order:

1. **API key**: ``Authorization: Bearer csk_<16 hex key id>_<43 base64url secret>`` (the
   format of Cosigner's keys); the key id is looked up in a dict loaded at startup from
   this prototype's own SQLite table ``api_keys``, SHA-256 of the secret compared with
   :func:`hmac.compare_digest` against the stored hash (what
   ``cosigner.identity.principals`` does, minus its cache expiry). A missing or wrong
   key: 401 problem ``unauthenticated``.
2. **Strict JSON**: orjson parses; the value is proven equal to what a strict stdlib
   parse would give when orjson's compact output of it *is* the body, byte for byte
   (the idea of ``cosigner/core/fastjson.py``: that output names each object's keys once,
   prints no integer outside ±(2**53 − 1) under ``OPT_STRICT_INTEGER``, and orjson reads
   no ``NaN``/``Infinity``). Otherwise the stdlib parser with hooks decides: duplicate
   keys, ``NaN``/``Infinity``/overflowing floats and integers beyond ±(2**53 − 1) are
   refused (422 problem ``invalid_json``).
3. **Envelope**: the DecisionRequest v1 members checked by hand (unknown members
   refused, types, lengths, no NUL, tool-name pattern, ``side_effect`` and ``mode``
   literals), the work pydantic's ``DecisionRequestV1`` does in Cosigner (422
   ``invalid_request``).
4. **Catalogue**: the tool must be in policies/refunds/tools.yaml (else the decision is
   ``deny`` ``unknown_tool``); its JSON Schema (draft 2020-12) validates ``args`` with
   ``jsonschema_rs``. ``integer`` is strict as in Cosigner: arguments holding a float
   are refused for a schema that allows no ``number`` (422 ``invalid_args``).
5. **Policy**: ``decide(input)`` of policies/refunds/rules.py, loaded from the file
   (allow ≤ 100000 minor units, require_approval ≤ 200000, deny above); bundle id and
   version from its manifest.toml, revision = SHA-256 over the bundle's files.
6. **RFC 8785 + SHA-256**: the request and ``args`` in canonical form through orjson's
   sorted-keys output where that is provably RFC 8785 (no float anywhere, no key beyond
   the BMP), else the ``rfc8785`` package; ``args_hash = "sha256:" + hex``.
7. **Permit** (allow only): a compact JWS, header ``{"alg":"EdDSA","kid",...,"typ":
   "cosigner-permit+jwt"}``, claims ``iss aud jti iat exp tenant tool args_hash
   decision_id``, signed Ed25519 with libsodium (``nacl.bindings.crypto_sign``).
8. **Ids**: UUIDv7 (``uuid_utils``) for the decision, the permit ``jti`` and both events.
9. **Durable write before the answer** (group commit): the request enqueues its rows; one
   drain task takes everything queued, chains the audit events of each decision (an
   allow has two: ``decision.made`` and ``permit.issued``; other effects the first)
   (``hash = "sha256:" + hex(SHA-256(RFC 8785 body))``, the body holding ``prev_hash``
   and ``seq``; the head is kept in memory by that one task), runs ``BEGIN`` and one
   ``executemany`` per table (decision row, permit row, stored call input = the
   canonical request, events) on its own ``sqlite3`` connection (WAL,
   ``synchronous=FULL``), and hands ``COMMIT`` to one writer thread, off the event
   loop (``LEAN_PROTO_INSERTS=thread``: the inserts go to that thread too). Every
   request of the batch is answered after its COMMIT; a failed batch is rolled back
   and each of its requests answered 503 ``unavailable``.
10. **Answer**: ``{"decision_id","request_id","effect","reasons","policy":{id,version,
    revision},"args_hash","permit":{"token","jti","expires_at"}|null}`` as compact JSON.

What it omits relative to Cosigner's ``POST /v1/decisions`` (the study did not have
them): idempotent replay of a ``request_id`` (a repeated id fails its whole batch on
the unique index: 503), rate limits and quotas, metrics, logging, tracing, argument
masking, shadow mode (``mode: "shadow"`` is refused), run contracts and per-run state,
approvals (``require_approval`` is answered and logged but creates no approval request),
policy reload/tenancy (one bundle for every tenant), key expiry/disable and rotation,
trusted-proxy handling, the body-size limit's streaming check (a body is read whole,
then refused above :data:`MAX_BODY`), the problem documents' per-field ``errors`` lists,
replica notification and the PostgreSQL path. It stores each fact once (no compression
dictionary, no token re-encoding).

Run it::

    python bench/lean_proto.py init --database DB --signing-key FILE --tenant bench
    LEAN_PROTO_DATABASE=DB LEAN_PROTO_SIGNING_KEY=FILE \\
        python bench/serve_asgi.py bench.lean_proto:app --port 9005
    python bench/lean_proto.py cost          # in-process µs per step (no HTTP)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import hashlib
import hmac
import importlib.util
import json
import math
import os
import re
import secrets
import sqlite3
import sys
import time
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jsonschema_rs
import orjson
import rfc8785
import yaml
from nacl.bindings import crypto_sign, crypto_sign_seed_keypair
from uuid_utils import uuid7

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "policies" / "refunds"
MAX_BODY = 64 * 1024
MAX_SAFE = 2**53 - 1
ISSUER = "cosigner-lean-proto"
AUDIENCE = "cosigner-runtime"
PERMIT_TTL_S = 86_400
GENESIS = "sha256:" + "0" * 64
_KEY_RE = re.compile(r"csk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})\Z")
_TOOL_RE = re.compile(r"[A-Za-z0-9_.:/-]+\Z")
_BEYOND_BMP = re.compile(b"[\xf0-\xff]")
_SIDE_EFFECTS = frozenset({"none", "read", "write", "financial", "destructive"})
_REQUEST_KEYS = frozenset({"request_id", "run", "principal", "initiator", "tool", "args",
                           "context", "mode"})
_RUN_KEYS = frozenset({"id", "step", "trace_id"})
_PARTY_KEYS = frozenset({"id", "type"})
_TOOL_KEYS = frozenset({"name", "version", "side_effect"})

SCHEMA = """
CREATE TABLE IF NOT EXISTS principals (
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, subject TEXT NOT NULL, roles TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS api_keys (
  id TEXT PRIMARY KEY, principal_id TEXT NOT NULL REFERENCES principals(id),
  secret_hash TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS decisions (
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, request_id TEXT NOT NULL,
  run_id TEXT NOT NULL, principal_id TEXT NOT NULL, tool TEXT NOT NULL,
  effect TEXT NOT NULL, reasons TEXT NOT NULL, policy_id TEXT NOT NULL,
  policy_version TEXT NOT NULL, args_hash TEXT NOT NULL, created_at INTEGER NOT NULL,
  UNIQUE (tenant, request_id));
CREATE TABLE IF NOT EXISTS permits (
  jti TEXT PRIMARY KEY, decision_id TEXT NOT NULL, tenant TEXT NOT NULL,
  tool TEXT NOT NULL, args_hash TEXT NOT NULL, iat INTEGER NOT NULL,
  exp INTEGER NOT NULL, token TEXT NOT NULL, redeemed_at INTEGER);
CREATE TABLE IF NOT EXISTS call_inputs (
  decision_id TEXT PRIMARY KEY, input BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS audit_events (
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL,
  decision_id TEXT, body BLOB NOT NULL, hash TEXT NOT NULL, UNIQUE (tenant, seq));
"""


# --- strict JSON --------------------------------------------------------------------

class Refused(Exception):
    """A request answered with a problem document: ``status``, ``code``, ``detail``."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate key")
    return out


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _integer(text: str) -> int:
    value = int(text)
    if not -MAX_SAFE <= value <= MAX_SAFE:
        raise ValueError("integer outside ±(2**53 - 1)")
    return value


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("number overflows")
    return value


def parse_strict(body: bytes) -> Any:
    """The JSON value of ``body`` (UTF-8), refusing duplicate keys, NaN/Infinity,
    floats overflowing to infinity and integers outside ±(2**53 − 1).

    Fast path: orjson's compact output of its parse equals the body, which proves the
    stdlib parse below would give the same value (module docstring, step 2).

    Raises:
        Refused: 422 ``invalid_json``.
    """
    try:
        value = orjson.loads(body)
        if orjson.dumps(value, option=orjson.OPT_STRICT_INTEGER) == body:
            return value
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        pass
    try:
        return json.loads(body.decode("utf-8"), object_pairs_hook=_pairs,
                          parse_constant=_constant, parse_int=_integer,
                          parse_float=_finite)
    except (ValueError, RecursionError) as exc:
        raise Refused(422, "invalid_json", f"the body is not strict JSON: {exc}") from None


def _has_float(value: Any) -> bool:
    """True when a float is anywhere in ``value`` (parsed JSON)."""
    t = type(value)
    if t is dict:
        items: Any = value.values()
    elif t is list:
        items = value
    else:
        return t is float
    for item in items:
        t = type(item)
        if t is float or ((t is dict or t is list) and _has_float(item)):
            return True
    return False


def canonical(value: Any, floats: bool) -> bytes:
    """RFC 8785 bytes of ``value`` (parsed strict JSON). orjson's sorted-keys output is
    RFC 8785 when no float is present (``floats`` False) and no key lies beyond the BMP
    (orjson sorts by code point, RFC 8785 by UTF-16 unit; equal within the BMP);
    otherwise the ``rfc8785`` package writes it."""
    if not floats:
        out = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        if out.isascii() or not _BEYOND_BMP.search(out):
            return out
    return rfc8785.dumps(value)


# --- the envelope -------------------------------------------------------------------

def _text(value: Any, where: str, limit: int = 256, minimum: int = 1) -> str:
    if type(value) is not str or not minimum <= len(value) <= limit or "\x00" in value:
        raise Refused(422, "invalid_request", f"{where} must be a string of {minimum}.."
                      f"{limit} characters without NUL")
    return value


def _object(value: Any, where: str, allowed: frozenset[str]) -> dict[str, Any]:
    if type(value) is not dict:
        raise Refused(422, "invalid_request", f"{where} must be an object")
    if not value.keys() <= allowed:
        raise Refused(422, "invalid_request",
                      f"{where}: unknown members {sorted(value.keys() - allowed)}")
    return value


def check_envelope(request: Any) -> None:
    """What ``DecisionRequestV1`` checks, by hand.

    Raises:
        Refused: 422 ``invalid_request`` naming the first faulty member.
    """
    _object(request, "the request", _REQUEST_KEYS)
    _text(request.get("request_id"), "request_id")
    run = _object(request.get("run"), "run", _RUN_KEYS)
    _text(run.get("id"), "run.id")
    step = run.get("step")
    if step is not None and (type(step) is not int or step < 0):
        raise Refused(422, "invalid_request", "run.step must be an integer ≥ 0")
    if run.get("trace_id") is not None:
        _text(run["trace_id"], "run.trace_id", minimum=0)
    for name in ("principal", "initiator"):
        party = _object(request.get(name), name, _PARTY_KEYS)
        _text(party.get("id"), f"{name}.id")
        if "type" in party:
            _text(party["type"], f"{name}.type", 64)
    tool = _object(request.get("tool"), "tool", _TOOL_KEYS)
    name = _text(tool.get("name"), "tool.name")
    if not _TOOL_RE.match(name):
        raise Refused(422, "invalid_request", "tool.name has a character outside "
                      "[A-Za-z0-9_.:/-]")
    if tool.get("version") is not None:
        _text(tool["version"], "tool.version", 64, 0)
    if tool.get("side_effect") is not None and tool["side_effect"] not in _SIDE_EFFECTS:
        raise Refused(422, "invalid_request", "tool.side_effect is not a known class")
    if type(request.get("args")) is not dict:
        raise Refused(422, "invalid_request", "args must be an object")
    if type(request.get("context", {})) is not dict:
        raise Refused(422, "invalid_request", "context must be an object")
    mode = request.get("mode", "on")
    if mode != "on":
        raise Refused(422, "invalid_request", "mode must be \"on\" (the prototype has no "
                      "shadow mode)")


# --- bundle, keys and signing --------------------------------------------------------

class Bundle:
    """policies/refunds: manifest, compiled catalogue validators and the rule."""

    def __init__(self, folder: Path = BUNDLE) -> None:
        manifest = tomllib.loads((folder / "manifest.toml").read_text())
        digest = hashlib.sha256()
        for path in sorted(p for p in folder.iterdir() if p.is_file()):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        self.ref = {"id": manifest["id"], "version": manifest["version"],
                    "revision": "sha256:" + digest.hexdigest()}
        tools = yaml.safe_load((folder / manifest["catalogue"]).read_text())["tools"]
        #: tool → (compiled validator, whether its schema allows a float anywhere)
        self.tools = {
            name: (jsonschema_rs.Draft202012Validator(spec["schema"], validate_formats=False),
                   '"number"' in json.dumps(spec["schema"]))
            for name, spec in tools.items()}
        spec = importlib.util.spec_from_file_location("lean_proto_rules",
                                                      folder / "rules.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self.decide: Callable[[dict[str, Any]], dict[str, Any]] = getattr(
            module, manifest["entrypoint"])


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


class Signer:
    """Ed25519 compact JWS with libsodium; ``kid`` = first 16 hex of SHA-256(public key)."""

    def __init__(self, seed: bytes) -> None:
        public, self._secret = crypto_sign_seed_keypair(seed)
        self.public = public
        self.kid = hashlib.sha256(public).hexdigest()[:16]
        self._header = _b64(orjson.dumps({"alg": "EdDSA", "kid": self.kid,
                                          "typ": "cosigner-permit+jwt"}))

    def sign(self, claims: dict[str, Any]) -> str:
        signing_input = self._header + b"." + _b64(orjson.dumps(claims))
        signature = crypto_sign(signing_input, self._secret)[:64]
        return (signing_input + b"." + _b64(signature)).decode()


def load_keys(database: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """key id → (hex SHA-256 of the secret, principal ``{id, tenant, subject}``)."""
    conn = sqlite3.connect(database)
    try:
        rows = conn.execute(
            "SELECT k.id, k.secret_hash, p.id, p.tenant, p.subject FROM api_keys k "
            "JOIN principals p ON p.id = k.principal_id").fetchall()
    finally:
        conn.close()
    return {key_id: (secret_hash, {"id": pid, "tenant": tenant, "subject": subject})
            for key_id, secret_hash, pid, tenant, subject in rows}


def authenticate(keys: dict[str, tuple[str, dict[str, Any]]], header: bytes | None
                 ) -> dict[str, Any]:
    """The principal of ``Authorization: Bearer csk_...``.

    Raises:
        Refused: 401 ``unauthenticated``.
    """
    if header is not None and header[:7].lower() == b"bearer ":
        match = _KEY_RE.match(header[7:].strip().decode("latin-1"))
        if match is not None:
            entry = keys.get(match.group(1))
            digest = hashlib.sha256(match.group(2).encode()).hexdigest()
            if entry is not None and hmac.compare_digest(digest, entry[0]):
                return entry[1]
    raise Refused(401, "unauthenticated", "a valid API key is required "
                  "(Authorization: Bearer csk_...)")


# --- the decision --------------------------------------------------------------------

class Prepared:
    """One decision's rows, ready for the group commit (event bodies are chained by the
    drain task); ``answer`` is sent once the batch is committed."""

    __slots__ = ("decision", "permit", "call_input", "events", "answer", "future")

    def __init__(self, decision: tuple[Any, ...], permit: tuple[Any, ...] | None,
                 call_input: tuple[str, bytes], events: list[dict[str, Any]],
                 answer: bytes) -> None:
        self.decision, self.permit, self.call_input = decision, permit, call_input
        self.events, self.answer = events, answer
        self.future: asyncio.Future[bool] | None = None


def prepare(bundle: Bundle, signer: Signer, principal: dict[str, Any], body: bytes,
            now: float | None = None) -> Prepared:
    """Steps 2–8 of the module docstring for one body; no I/O.

    Raises:
        Refused: 422 ``invalid_json`` / ``invalid_request`` / ``invalid_args``.
    """
    request = parse_strict(body)
    check_envelope(request)
    tool = request["tool"]["name"]
    args = request["args"]
    floats = _has_float(request)
    entry = bundle.tools.get(tool)
    if entry is None:
        outcome = {"effect": "deny", "reasons": [{"code": "unknown_tool",
                                                  "message": f"{tool} is not in the catalogue"}]}
    else:
        validator, allows_float = entry
        if (floats and not allows_float and _has_float(args)) or not validator.is_valid(args):
            raise Refused(422, "invalid_args", f"arguments of {tool} do not match its schema")
        tenant = principal["tenant"]
        outcome = bundle.decide({
            "tenant": tenant, "tool": request["tool"], "args": args,
            "principal": request["principal"], "initiator": request["initiator"],
            "run": request["run"], "context": request.get("context", {}),
            "caller": {"subject": principal["subject"], "principal_id": principal["id"]}})
    tenant = principal["tenant"]
    call_input = canonical(request, floats)
    args_hash = "sha256:" + hashlib.sha256(canonical(args, floats)).hexdigest()
    iat = int(time.time() if now is None else now)
    decision_id = str(uuid7())
    effect, reasons = outcome["effect"], outcome["reasons"]
    policy = bundle.ref
    permit_row = None
    permit = None
    exp = iat + PERMIT_TTL_S
    if effect == "allow":
        jti = uuid7().hex
        token = signer.sign({"iss": ISSUER, "aud": AUDIENCE, "jti": jti, "iat": iat,
                             "exp": exp, "tenant": tenant, "tool": tool,
                             "args_hash": args_hash, "decision_id": decision_id})
        permit_row = (jti, decision_id, tenant, tool, args_hash, iat, exp, token)
        permit = {"token": token, "jti": jti,
                  "expires_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exp))}
    request_id = request["request_id"]
    actor = {"subject": principal["subject"], "principal_id": principal["id"], "kind": "key"}
    made = {"id": str(uuid7()), "type": "decision.made", "tenant": tenant, "at": iat,
            "actor": actor, "decision_id": decision_id, "request_id": request_id,
            "run_id": request["run"]["id"], "tool": tool, "args_hash": args_hash,
            "effect": effect, "reasons": reasons, "policy": policy}
    events = [made]
    if permit is not None:
        events.append({"id": str(uuid7()), "type": "permit.issued", "tenant": tenant,
                       "at": iat, "actor": actor, "decision_id": decision_id,
                       "jti": permit["jti"], "exp": exp})
    reasons_json = orjson.dumps(reasons).decode()
    decision_row = (decision_id, tenant, request_id, request["run"]["id"], principal["id"],
                    tool, effect, reasons_json, policy["id"], policy["version"], args_hash,
                    iat)
    answer = orjson.dumps({"decision_id": decision_id, "request_id": request_id,
                           "effect": effect, "reasons": reasons, "policy": policy,
                           "args_hash": args_hash, "permit": permit})
    return Prepared(decision_row, permit_row, (decision_id, call_input), events, answer)


# --- the group commit ------------------------------------------------------------------

_INSERT_DECISION = "INSERT INTO decisions VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
_INSERT_PERMIT = ("INSERT INTO permits (jti, decision_id, tenant, tool, args_hash, iat, exp, "
                  "token) VALUES (?,?,?,?,?,?,?,?)")
_INSERT_INPUT = "INSERT INTO call_inputs VALUES (?,?)"
_INSERT_EVENT = "INSERT INTO audit_events VALUES (?,?,?,?,?,?,?)"


def open_writer(database: str) -> sqlite3.Connection:
    """The committer's own connection: WAL, ``synchronous=FULL`` (unless
    ``LEAN_PROTO_SYNCHRONOUS=NORMAL``), explicit transactions, usable from the writer
    thread."""
    conn = sqlite3.connect(database, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    # LEAN_PROTO_SYNCHRONOUS=NORMAL: a diagnostic variant without the per-COMMIT fsync
    # (not durable on power loss; bench/README.md, session 12).
    mode = os.environ.get("LEAN_PROTO_SYNCHRONOUS", "FULL")
    if mode not in ("FULL", "NORMAL"):
        raise ValueError("LEAN_PROTO_SYNCHRONOUS must be FULL or NORMAL")
    conn.execute(f"PRAGMA synchronous={mode}")
    return conn


class Committer:
    """Requests enqueue :class:`Prepared` rows; one drain task chains the events of
    everything queued and one writer thread commits the batch; then every request of the
    batch is answered (True: durable; False: the batch failed and was rolled back)."""

    def __init__(self, database: str) -> None:
        self.conn = open_writer(database)
        #: tenant → (last seq, last hash) of its chain, kept by the drain task alone
        self.heads: dict[str, tuple[int, str]] = {
            tenant: (seq, digest) for tenant, seq, digest in self.conn.execute(
                "SELECT e.tenant, e.seq, e.hash FROM audit_events e JOIN (SELECT tenant, "
                "max(seq) AS seq FROM audit_events GROUP BY tenant) m "
                "ON m.tenant = e.tenant AND m.seq = e.seq")}
        self.queue: list[Prepared] = []
        self.wake = asyncio.Event()
        self.thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="commit")
        self.task: asyncio.Task[None] | None = None
        self.batches = 0

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._drain())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.thread.shutdown(wait=True)
        self.conn.close()

    async def submit(self, item: Prepared) -> bool:
        item.future = asyncio.get_running_loop().create_future()
        self.queue.append(item)
        self.wake.set()
        return await item.future

    def chain(self, batch: list[Prepared]) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
        """Event rows of ``batch`` chained after the in-memory heads; returns the rows and
        the heads before (to restore on failure)."""
        before = dict(self.heads)
        rows = []
        heads = self.heads
        for item in batch:
            for event in item.events:
                tenant = event["tenant"]
                seq, prev = heads.get(tenant, (0, GENESIS))
                seq += 1
                event["seq"], event["prev_hash"] = seq, prev
                text = canonical(event, False)
                digest = "sha256:" + hashlib.sha256(text).hexdigest()
                heads[tenant] = (seq, digest)
                rows.append((event["id"], tenant, seq, event["type"], event["decision_id"],
                             text, digest))
        return rows, before

    def insert(self, batch: list[Prepared], events: list[tuple[Any, ...]]) -> None:
        """``BEGIN`` and one ``executemany`` per table for the whole batch (the drain task
        runs it on the event loop); rolled back if any statement fails."""
        conn = self.conn
        try:
            conn.execute("BEGIN")
            conn.executemany(_INSERT_DECISION, [i.decision for i in batch])
            conn.executemany(_INSERT_PERMIT, [i.permit for i in batch if i.permit])
            conn.executemany(_INSERT_INPUT, [i.call_input for i in batch])
            conn.executemany(_INSERT_EVENT, events)
        except BaseException:
            self.rollback()
            raise

    def commit(self) -> None:
        """``COMMIT`` (the WAL fsync of ``synchronous=FULL``; runs in the writer thread);
        rolled back if it fails."""
        try:
            self.conn.execute("COMMIT")
        except BaseException:
            self.rollback()
            raise

    def rollback(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def write(self, batch: list[Prepared], events: list[tuple[Any, ...]]) -> None:
        """:meth:`insert` then :meth:`commit`, in the calling thread."""
        self.insert(batch, events)
        self.commit()

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        # LEAN_PROTO_INSERTS=thread: the variant running the inserts in the writer
        # thread too (measured against the default in bench/README.md, session 12).
        in_thread = os.environ.get("LEAN_PROTO_INSERTS") == "thread"
        while True:
            await self.wake.wait()
            self.wake.clear()
            batch, self.queue = self.queue, []
            if not batch:
                continue
            rows, before = self.chain(batch)
            try:
                if in_thread:
                    await loop.run_in_executor(self.thread, self.write, batch, rows)
                else:
                    self.insert(batch, rows)
                    await loop.run_in_executor(self.thread, self.commit)
                ok = True
            except Exception:  # noqa: BLE001 - the batch is answered 503
                self.heads = before
                ok = False
            self.batches += 1
            for item in batch:
                if item.future is not None and not item.future.done():
                    item.future.set_result(ok)


# --- the ASGI callable -----------------------------------------------------------------

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
_JSON = (b"content-type", b"application/json")
_PROBLEM = (b"content-type", b"application/problem+json")
_TITLES = {401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           413: "Content Too Large", 422: "Unprocessable Content",
           503: "Service Unavailable"}


def problem(status: int, code: str, detail: str) -> bytes:
    """An RFC 9457 problem document (Cosigner's members)."""
    return orjson.dumps({"type": f"https://cosigner.dev/problems/{code}",
                         "title": _TITLES.get(status, "Error"), "status": status,
                         "detail": detail, "code": code})


class LeanProto:
    """The raw ASGI callable. Configuration from the environment at lifespan startup:
    ``LEAN_PROTO_DATABASE`` (SQLite file made by ``init``) and ``LEAN_PROTO_SIGNING_KEY``
    (file of the 32-byte Ed25519 seed)."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[str, dict[str, Any]]] = {}
        self.bundle: Bundle | None = None
        self.signer: Signer | None = None
        self.committer: Committer | None = None

    def startup(self, database: str, signing_key: str) -> None:
        self.keys = load_keys(database)
        self.bundle = Bundle()
        self.signer = Signer(Path(signing_key).read_bytes())
        self.committer = Committer(database)
        self.committer.start()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self.http(scope, receive, send)
        elif kind == "lifespan":
            await self.lifespan(receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self.startup(os.environ["LEAN_PROTO_DATABASE"],
                                 os.environ["LEAN_PROTO_SIGNING_KEY"])
                except Exception as exc:  # noqa: BLE001 - reported to the server
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.committer is not None:
                    await self.committer.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path == "/v1/decisions":
            if method != "POST":
                status, body, ctype = 405, problem(405, "method_not_allowed", "POST only"), _PROBLEM
            else:
                status, body, ctype = await self.decide(scope, receive)
        elif path == "/healthz" and method == "GET":
            status, body, ctype = 200, b'{"status":"ok"}', _JSON
        else:
            status, body, ctype = 404, problem(404, "not_found", "no such route"), _PROBLEM
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(body)).encode()), ctype]})
        await send({"type": "http.response.body", "body": body})

    async def decide(self, scope: Scope, receive: Receive) -> tuple[int, bytes, Any]:
        header = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                header = value
                break
        try:
            principal = authenticate(self.keys, header)
            body = await _read_body(receive)
            assert self.bundle is not None and self.signer is not None
            assert self.committer is not None
            item = prepare(self.bundle, self.signer, principal, body)
        except Refused as exc:
            return exc.status, problem(exc.status, exc.code, exc.detail), _PROBLEM
        if not await self.committer.submit(item):
            return 503, problem(503, "unavailable", "the decision could not be logged"), \
                _PROBLEM
        return 200, item.answer, _JSON


async def _read_body(receive: Receive) -> bytes:
    message = await receive()
    body = message.get("body", b"")
    if not message.get("more_body"):
        return body  # type: ignore[no-any-return]
    parts = [body]
    size = len(body)
    while message.get("more_body"):
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise Refused(413, "body_too_large", f"the body exceeds {MAX_BODY} bytes")
        parts.append(chunk)
    return b"".join(parts)


app = LeanProto()


# --- set-up and the in-process cost split ------------------------------------------------

def init(database: str, signing_key: str, tenant: str) -> str:
    """Create the schema, one runtime principal of ``tenant`` with an API key, and an
    Ed25519 seed file; return the key (``csk_...``)."""
    conn = sqlite3.connect(database)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(SCHEMA)
    principal_id = str(uuid7())
    key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
    with conn:
        conn.execute("INSERT INTO principals VALUES (?,?,?,?)",
                     (principal_id, tenant, "bench-runtime", '["runtime"]'))
        conn.execute("INSERT INTO api_keys VALUES (?,?,?)",
                     (key_id, principal_id, hashlib.sha256(secret.encode()).hexdigest()))
    conn.close()
    Path(signing_key).write_bytes(secrets.token_bytes(32))
    return f"csk_{key_id}_{secret}"


def decide_body(n: int, tag: str = "cost", amount: int = 5000) -> bytes:
    """The body bench/lua/decide.lua sends for request ``n`` (allow mode, thread 1)."""
    return (f'{{"request_id":"req-{tag}-1-{n}","run":{{"id":"run-{tag}-1","step":{n}}},'
            '"principal":{"id":"customer-42","type":"customer"},'
            '"initiator":{"id":"agent-support","type":"agent"},'
            '"tool":{"name":"issue_refund","side_effect":"financial"},'
            f'"args":{{"order_id":"ord_8472","amount_minor":{amount},"currency":"USD",'
            '"reason_code":"duplicate_charge"},"context":{}}').encode()


def cost(iterations: int, batch: int) -> str:
    """µs of CPU per step of one allow decision, in process (no HTTP, no event loop for
    steps 1–8): each step timed alone over ``iterations`` calls (best of 5 repeats);
    the durable write as the writer thread does it, ``batch`` decisions per COMMIT,
    thread CPU and wall time per decision."""
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="lean-proto-cost-"))
    db, seed = str(tmp / "lean.db"), str(tmp / "seed")
    key = init(db, seed, "bench")
    keys = load_keys(db)
    bundle, signer = Bundle(), Signer(Path(seed).read_bytes())
    header = b"Bearer " + key.encode()
    body = decide_body(1)
    principal = authenticate(keys, header)
    request = parse_strict(body)
    args = request["args"]
    validator = bundle.tools["issue_refund"][0]
    policy_input = {"tenant": "bench", "tool": request["tool"], "args": args,
                    "principal": request["principal"], "initiator": request["initiator"],
                    "run": request["run"], "context": {}, "caller": {}}
    claims = {"iss": ISSUER, "aud": AUDIENCE, "jti": uuid7().hex, "iat": 1, "exp": 2,
              "tenant": "bench", "tool": "issue_refund", "args_hash": "sha256:" + "0" * 64,
              "decision_id": str(uuid7())}
    prepared = prepare(bundle, signer, principal, body)
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("API key: regex, dict lookup, SHA-256, compare_digest",
         lambda: authenticate(keys, header)),
        ("strict JSON: orjson loads + compact-dump proof", lambda: parse_strict(body)),
        ("envelope check (by hand)", lambda: check_envelope(request)),
        ("float walk (strict integer / RFC 8785 proof)", lambda: _has_float(request)),
        ("catalogue: jsonschema_rs is_valid", lambda: validator.is_valid(args)),
        ("refunds rule (policies/refunds/rules.py)", lambda: bundle.decide(policy_input)),
        ("RFC 8785 request + args, SHA-256 of args",
         lambda: (canonical(request, False),
                  hashlib.sha256(canonical(args, False)).hexdigest())),
        ("UUIDv7 ×4 (decision, jti, 2 events)",
         lambda: (str(uuid7()), uuid7().hex, str(uuid7()), str(uuid7()))),
        ("Ed25519 JWS (libsodium)", lambda: signer.sign(claims)),
        ("prepare() in all (steps 2-8 + rows + answer)",
         lambda: prepare(bundle, signer, principal, body)),
    ]
    committer_probe = Committer.__new__(Committer)
    committer_probe.heads = {}

    def chain_one() -> Any:
        for event in prepared.events:
            event.pop("seq", None)
            event.pop("prev_hash", None)
        return Committer.chain(committer_probe, [prepared])

    steps.insert(-1, ("chain 2 events: RFC 8785 + SHA-256 each", chain_one))
    lines = [f"{'step':58} {'µs':>7}"]
    for label, fn in steps:
        best = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(iterations):
                fn()
            best = min(best, time.perf_counter() - t0)
        lines.append(f"{label:58} {best / iterations * 1e6:7.2f}")
    # The durable write: batches of `batch` prepared decisions, as the writer thread runs.
    committer = Committer.__new__(Committer)
    committer.conn = open_writer(db)
    committer.heads = {}
    rounds = max(20, iterations // (batch * 10))
    items = [[prepare(bundle, signer, principal, decide_body(r * batch + i, "w"))
              for i in range(batch)] for r in range(rounds)]
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    for group in items:
        rows, _ = committer.chain(group)
        committer.write(group, rows)
    cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    n = rounds * batch
    lines.append(f"{f'chain + write, {batch} per COMMIT (thread CPU)':58} {cpu / n * 1e6:7.2f}")
    lines.append(f"{f'chain + write, {batch} per COMMIT (wall, fsync included)':58} "
                 f"{wall / n * 1e6:7.2f}")
    committer.conn.close()
    lines += _asgi_cost(db, seed, key, max(2_000, iterations // 2))
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    decisions = conn.execute("SELECT count(*) FROM decisions").fetchone()[0]
    conn.close()
    size = sum(p.stat().st_size for p in tmp.iterdir() if p.name != "seed")
    lines.append(f"database after a WAL checkpoint: {size / decisions:,.0f} B per allow "
                 f"decision ({decisions:,} decisions, indexes included)")
    for p in tmp.iterdir():
        p.unlink()
    tmp.rmdir()
    return "\n".join(lines)


def _asgi_cost(database: str, seed: str, key: str, requests: int,
               concurrency: int = 16) -> list[str]:
    """The ASGI callable driven in process on uvloop (no sockets, no HTTP parsing):
    ``concurrency`` tasks sending ``requests`` allow bodies in all; process CPU (event
    loop + writer thread) and wall time per request, and decisions per COMMIT."""
    import uvloop

    proto = LeanProto()
    headers = [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {key}".encode()),
               (b"content-type", b"application/json")]

    async def one(n: int) -> None:
        body = decide_body(n, "asgi")
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await proto({"type": "http", "method": "POST", "path": "/v1/decisions",
                     "headers": headers}, receive, send)
        if sent[0]["status"] != 200 or b'"effect":"allow"' not in sent[1]["body"]:
            raise RuntimeError(f"unexpected answer {sent}")

    async def worker(first: int, stop: int) -> None:
        for n in range(first, stop, concurrency):
            await one(n)

    async def run() -> tuple[float, float, int]:
        proto.startup(database, seed)
        assert proto.committer is not None
        await asyncio.gather(*(worker(i, requests) for i in range(concurrency)))  # warm-up
        batches0 = proto.committer.batches
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(requests + i, 2 * requests)
                               for i in range(concurrency)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        batches = proto.committer.batches - batches0
        await proto.committer.stop()
        return cpu, wall, batches

    cpu, wall, batches = uvloop.run(run())
    n = requests
    return [f"{f'ASGI callable in process, c={concurrency} (process CPU)':58} "
            f"{cpu / n * 1e6:7.2f}",
            f"{f'ASGI callable in process, c={concurrency} (wall)':58} {wall / n * 1e6:7.2f}"
            f"   ({n / max(batches, 1):.1f} decisions per COMMIT)"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_init = sub.add_parser("init", help="schema, one API key (printed), a signing seed")
    p_init.add_argument("--database", required=True)
    p_init.add_argument("--signing-key", required=True)
    p_init.add_argument("--tenant", default="bench")
    p_cost = sub.add_parser("cost", help="in-process µs per step of one allow")
    p_cost.add_argument("--iterations", type=int, default=20_000)
    p_cost.add_argument("--batch", type=int, default=16)
    args = parser.parse_args(argv)
    if args.command == "init":
        print(init(args.database, args.signing_key, args.tenant))
    else:
        print(cost(args.iterations, args.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())

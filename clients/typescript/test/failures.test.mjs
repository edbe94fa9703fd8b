// Failure kinds (issue 19), fail directions and site modes (issue 18) against a live
// Cosigner (started by tests/client_ts/test_typescript.py), each kind from a real cause:
// the live server where it can give it, else a tiny loopback HTTP server of the test's own.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { randomUUID } from "node:crypto";
import { FAILURE_KINDS, Gate, InvalidArguments } from "../dist/index.js";
import { ACTORS, api, closedPort, env, live, stalledSocket } from "./helpers.mjs";

const newGate = (url = env.url, opts = {}, key = env.runtime) => new Gate(url, key, { ...ACTORS, run: `run-${randomUUID()}`, ...opts });

/** A loopback server answering every request with `status`, `headers`, `body` (counts requests). */
async function answering(status, body, headers = {}) {
  const hits = [];
  const server = http.createServer(async (req, res) => {
    for await (const _ of req);
    hits.push({ method: req.method, path: req.url, at: performance.now() });
    res.writeHead(status, { "Content-Type": "application/json", ...headers }).end(body);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    hits,
    close: () => new Promise((r) => { server.closeAllConnections?.(); server.close(r); }),
  };
}

const problem = (code, detail = "injected") => JSON.stringify({ type: "about:blank", title: code, code, detail });

test("ten failure kinds, as the Python client names them", () => {
  assert.deepEqual([...FAILURE_KINDS].sort(), ["aborted", "auth", "breaker_open", "invalid", "malformed", "overloaded", "rate_limited", "timeout", "too_large", "unavailable"]);
});

test("auth: a bad key → deny, kind auth (the server's code kept)", live, async () => {
  const d = await newGate(env.url, {}, "not-a-key").decide("read_note", { note_id: "n" });
  assert.equal(d.effect, "deny");
  assert.equal(d.error.kind, "auth");
  assert.equal(d.error.status, 401);
  assert.equal(d.error.name, "ServerRefused");
  assert.equal(d.failDirection, "deny");
});

test("invalid: an unhashable argument is refused before any network call, kind invalid", live, async () => {
  const gate = newGate(await closedPort());
  await assert.rejects(gate.decide("read_note", { n: 2 ** 60 }), (e) => e instanceof InvalidArguments && e.kind === "invalid");
  await assert.rejects(gate.decide("read_note", { n: NaN }), (e) => e.kind === "invalid");
  assert.equal(gate.breaker.state, "closed"); // nothing was sent
});

test("invalid: the live server's 422 (a malformed tool side effect) → kind invalid", live, async () => {
  const d = await newGate().decide("read_note", { note_id: "n" }, { sideEffect: "no-such-class" });
  assert.equal(d.effect, "deny");
  assert.equal(d.error.kind, "invalid", JSON.stringify(d.error));
  assert.ok([400, 422].includes(d.error.status));
});

test("too_large: a body over the server's limit → deny, kind too_large; never opened", live, async () => {
  const gate = newGate(env.url, { failDirections: { read_note: "proceed" } });
  let runs = 0;
  const r = await gate.call("read_note", { blob: "x".repeat(1_100_000) }, () => { runs += 1; });
  assert.equal(r.status, "denied");
  assert.equal(r.failure, "too_large");
  assert.equal(r.decision.error.status, 413);
  assert.equal(runs, 0);
});

test("malformed: garbage or a wrongly shaped answer → kind malformed", live, async () => {
  for (const body of ["<html>not json", JSON.stringify({ hello: "world" })]) {
    const srv = await answering(200, body);
    try {
      const d = await newGate(srv.url, { retries: 0 }).decide("read_note", { note_id: "n" });
      assert.equal(d.effect, "deny");
      assert.equal(d.error.kind, "malformed", body);
      assert.equal(d.error.code, "malformed");
    } finally {
      await srv.close();
    }
  }
});

test("unavailable: a closed port, and a plain 500 → kind unavailable", live, async () => {
  const d = await newGate(await closedPort(), { retries: 0 }).decide("read_note", { note_id: "n" });
  assert.equal(d.error.kind, "unavailable");
  const srv = await answering(500, problem("internal_error"));
  try {
    const e = (await newGate(srv.url, { retries: 0 }).decide("read_note", { note_id: "n" })).error;
    assert.equal(e.kind, "unavailable");
    assert.equal(e.serverCode, "internal_error");
  } finally {
    await srv.close();
  }
});

test("timeout: a server that stalls → kind timeout", live, async () => {
  const stalled = await stalledSocket();
  try {
    const d = await newGate(stalled.url, { timeoutMs: 300, retries: 0 }).decide("read_note", { note_id: "n" });
    assert.equal(d.effect, "deny");
    assert.equal(d.error.kind, "timeout");
  } finally {
    await stalled.close();
  }
});

test("aborted: the caller's AbortSignal → kind aborted; never opened, breaker untouched", live, async () => {
  const stalled = await stalledSocket();
  try {
    const gate = newGate(stalled.url, { timeoutMs: 5000, retries: 0, failDirections: { read_note: "proceed" } });
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 100);
    let runs = 0;
    const started = performance.now();
    const r = await gate.call("read_note", { note_id: "n" }, () => { runs += 1; }, { signal: controller.signal });
    assert.ok(performance.now() - started < 3000);
    assert.equal(r.status, "denied");
    assert.equal(r.failure, "aborted");
    assert.equal(r.failDirection, "deny");
    assert.equal(runs, 0);
    assert.equal(gate.breaker.state, "closed");
  } finally {
    await stalled.close();
  }
});

test("breaker_open: after failures the server is not asked, kind breaker_open", live, async () => {
  const srv = await answering(500, problem("internal_error"));
  try {
    const gate = newGate(srv.url, { retries: 0, breakerThreshold: 2, breakerCooldownMs: 60000 });
    const kinds = [];
    for (let i = 0; i < 3; i++) kinds.push((await gate.decide("read_note", { note_id: "n" })).error.kind);
    assert.deepEqual(kinds, ["unavailable", "unavailable", "breaker_open"]);
    assert.equal(srv.hits.length, 2);
  } finally {
    await srv.close();
  }
});

test("rate_limited: 429 with Retry-After; retried after the wait only while it fits in the deadline", live, async () => {
  const srv = await answering(429, problem("rate_limited"), { "Retry-After": "1" });
  try {
    // Fits: 1 s inside a 3 s deadline → asked again no sooner than the server said.
    const d = await newGate(srv.url, { timeoutMs: 3000, retries: 2 }).decide("read_note", { note_id: "n" });
    assert.equal(d.effect, "deny");
    assert.equal(d.error.kind, "rate_limited");
    assert.equal(d.error.code, "rate_limited");
    assert.equal(d.error.retryAfter, 1);
    assert.ok(srv.hits.length >= 2, `hits ${srv.hits.length}`);
    assert.ok(srv.hits[1].at - srv.hits[0].at >= 950);
    // Does not fit: 1 s past a 400 ms deadline → one request, no waiting.
    srv.hits.length = 0;
    const started = performance.now();
    const e = (await newGate(srv.url, { timeoutMs: 400, retries: 2 }).decide("read_note", { note_id: "n" })).error;
    assert.equal(e.kind, "rate_limited");
    assert.equal(srv.hits.length, 1);
    assert.ok(performance.now() - started < 900);
  } finally {
    await srv.close();
  }
});

test("overloaded: 503 with the problem code overloaded → kind overloaded, retryAfter kept", live, async () => {
  const srv = await answering(503, problem("overloaded"), { "Retry-After": "7" });
  try {
    const d = await newGate(srv.url, { timeoutMs: 500, retries: 1 }).decide("read_note", { note_id: "n" });
    assert.equal(d.error.kind, "overloaded");
    assert.equal(d.error.retryAfter, 7);
    assert.equal(d.error.status, 503);
  } finally {
    await srv.close();
  }
});

test("fail direction deny is the default; proceed runs without a decision and records it", live, async () => {
  const port = await closedPort();
  let runs = 0;
  const denied = await newGate(port, { retries: 0 }).call("read_note", { note_id: "n" }, () => { runs += 1; });
  assert.equal(denied.status, "denied");
  assert.equal(denied.failDirection, "deny");
  assert.equal(denied.failure, "unavailable");
  const gate = newGate(port, { retries: 0, failDirections: { read_note: "proceed" } });
  const ran = await gate.call("read_note", { note_id: "n" }, () => { runs += 1; return "read"; });
  assert.equal(ran.status, "proceeded_on_timeout");
  assert.equal(ran.failDirection, "proceed");
  assert.equal(ran.decision.failDirection, "proceed");
  assert.equal(ran.failure, "unavailable");
  assert.equal(ran.unwrap(), "read");
  // Only the named tool opens.
  const other = await gate.call("write_note", { note_id: "n" }, () => { runs += 1; });
  assert.equal(other.status, "denied");
  assert.equal(runs, 1);
});

test("fail direction ask: askHuman decides (true runs, false denies); never for auth", live, async () => {
  const srv = await answering(503, problem("overloaded"), { "Retry-After": "1" });
  try {
    const asked = [];
    let answer = true;
    const gate = newGate(srv.url, {
      retries: 0,
      failDirections: { read_note: "ask" },
      askHuman: async (tool, args, error) => { asked.push([tool, args.note_id, error.kind]); return answer; },
    });
    let runs = 0;
    const yes = await gate.call("read_note", { note_id: "a" }, () => { runs += 1; return "ok"; });
    assert.equal(yes.status, "approved_by_human_on_failure");
    assert.equal(yes.failDirection, "ask");
    assert.equal(yes.unwrap(), "ok");
    answer = false;
    const no = await gate.call("read_note", { note_id: "b" }, () => { runs += 1; });
    assert.equal(no.status, "denied");
    assert.equal(no.failDirection, "ask");
    assert.equal(no.failure, "overloaded");
    assert.deepEqual(asked, [["read_note", "a", "overloaded"], ["read_note", "b", "overloaded"]]);
    assert.equal(runs, 1);
  } finally {
    await srv.close();
  }
  // auth is the caller's problem, not the server's: deny without asking.
  let asked = 0;
  const gate = newGate(env.url, { failDirections: { read_note: "ask" }, askHuman: () => { asked += 1; return true; } }, "not-a-key");
  const r = await gate.call("read_note", { note_id: "c" }, () => assert.fail("ran"));
  assert.equal(r.status, "denied");
  assert.equal(r.failure, "auth");
  assert.equal(r.failDirection, "deny");
  assert.equal(asked, 0);
  assert.throws(() => new Gate(env.url, env.runtime, { ...ACTORS, failDirections: { x: "ask" } }), TypeError);
});

test("shadow: the tool always runs; the decision is recorded as shadow and has no permit", live, async () => {
  const gate = newGate(env.url, { mode: "shadow" });
  const ran = [];
  const allowed = await gate.call("read_note", { note_id: "s1" }, (a) => { ran.push(a.note_id); return "read"; }, { sideEffect: "read" });
  const denied = await gate.call("delete_everything", { scope: "s2" }, (a) => { ran.push(a.scope); return "deleted"; });
  const review = await gate.call("wire_money", { to: "acct", amount_minor: 1 }, () => { ran.push("wire"); return "sent"; });
  assert.deepEqual([allowed.status, denied.status, review.status], ["shadow", "shadow", "shadow"]);
  assert.deepEqual(ran, ["s1", "s2", "wire"]);
  assert.deepEqual([allowed.decision.effect, denied.decision.effect, review.decision.effect], ["allow", "deny", "require_approval"]);
  assert.equal(allowed.unwrap(), "read");
  for (const r of [allowed, denied, review]) {
    assert.equal(r.decision.permit, null);
    assert.equal(r.decision.approval, null);
    assert.ok(r.decision.decisionId);
  }
  // The live server recorded it (same request id → the same decision) as a shadow one:
  // asking for a review of the shadow allow cannot turn it into a permit.
  const again = await newGate().decide("read_note", { note_id: "s1" }, { requestId: allowed.decision.requestId, run: gate.run, mode: "shadow", sideEffect: "read" });
  assert.equal(again.decisionId, allowed.decision.decisionId, JSON.stringify(again));
  const ask = await api("POST", "/v1/approvals", env.runtime, { decision_id: allowed.decision.decisionId, reason: "check" });
  assert.equal(ask.status, 422, JSON.stringify(ask.data));
  assert.equal(ask.data.code, "shadow_decision");
  // Per tool and per call: modes and the call's mode override the gate's.
  const mixed = newGate(env.url, { modes: { delete_everything: "shadow" } });
  assert.equal((await mixed.call("delete_everything", { scope: "s3" }, () => "deleted")).status, "shadow");
  assert.equal((await mixed.call("read_note", { note_id: "s4" }, () => "read", { sideEffect: "read" })).status, "executed");
  assert.equal((await newGate().call("delete_everything", { scope: "s5" }, () => "deleted", { mode: "shadow" })).status, "shadow");
});

test("off: the tool runs and Cosigner is not asked (no request at all)", live, async () => {
  const srv = await answering(500, problem("internal_error"));
  try {
    const gate = newGate(srv.url, { modes: { read_note: "off" } });
    const r = await gate.call("read_note", { note_id: "o" }, () => "read");
    assert.equal(r.status, "off");
    assert.equal(r.unwrap(), "read");
    assert.equal(r.decision.decisionId, null);
    const r2 = await newGate(srv.url).call("delete_everything", { scope: "o" }, () => "deleted", { mode: "off" });
    assert.equal(r2.status, "off");
    assert.equal(srv.hits.length, 0);
    assert.throws(() => newGate(srv.url, { mode: "maybe" }), TypeError);
  } finally {
    await srv.close();
  }
});

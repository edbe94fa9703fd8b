// The TypeScript Gate against a live Cosigner (started by tests/client_ts/test_typescript.py).
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { Gate, PermitVerifier } from "../dist/index.js";
import { ACTORS, api, closedPort, env, faultProxy, live, pendingFor, review, stalledSocket } from "./helpers.mjs";

const newGate = (url = env.url, opts = {}) => new Gate(url, env.runtime, { ...ACTORS, run: `run-${randomUUID()}`, ...opts });
// Floats, non-ASCII and nesting: the server's args_hash must equal the client's or the
// decision is a deny with args_hash_mismatch.
const NOTE = { note_id: "n-1", title: "Café ☕ 😀", weight: 0.1, scale: 1e-7, tags: ["b", "a"], nested: { z: 1, a: -0 } };

test("allow: the body runs once, after redeem; outcome reported", live, async () => {
  const gate = newGate();
  let runs = 0;
  const result = await gate.call("read_note", NOTE, (args) => { runs += 1; return `read ${args.note_id}`; }, { sideEffect: "read" });
  assert.equal(result.status, "executed", JSON.stringify(result.decision));
  assert.equal(result.unwrap(), "read n-1");
  assert.equal(runs, 1);
  assert.equal(result.redemption.ok, true);
  assert.equal(result.outcome.ok, true);
  assert.match(result.decision.argsHash, /^sha256:[0-9a-f]{64}$/);
});

test("deny: the body never runs; the refusal is data with the policy's reason", live, async () => {
  const gate = newGate();
  let runs = 0;
  const result = await gate.call("delete_everything", { scope: "all" }, () => { runs += 1; });
  assert.equal(result.status, "denied");
  assert.equal(result.code, "destructive_forbidden");
  assert.equal(runs, 0);
  assert.throws(() => result.unwrap(), { name: "CallRefused", code: "destructive_forbidden" });
});

test("approval: call waits, a human approves through the API, the body runs once", live, async () => {
  const gate = newGate();
  let runs = 0;
  const args = { to: "acct-9", amount_minor: 5000 + Math.floor(Math.random() * 1000) };
  const pending = gate.call("wire_money", args, () => { runs += 1; return "sent"; }, { approvalTimeoutMs: 20000 });
  const approval = await pendingFor(String(args.amount_minor));
  await review(approval.id);
  const result = await pending;
  assert.equal(result.status, "executed");
  assert.equal(result.approval.status, "approved");
  assert.equal(runs, 1);
});

test("approval: wait is abortable; resumed later from the approval id alone; redeems once", live, async () => {
  const gate = newGate();
  const args = { to: "acct-7", amount_minor: 7000 };
  const decision = await gate.decide("wire_money", args);
  assert.equal(decision.effect, "require_approval");
  assert.ok(decision.approval.reviewUrl, "review link");
  const controller = new AbortController();
  const waiting = gate.waitForApproval(decision, { timeoutMs: 20000, signal: controller.signal });
  setImmediate(() => controller.abort());
  const aborted = await waiting;
  assert.equal(aborted.status, "pending");
  assert.equal(aborted.error.code, "aborted");

  await review(decision.approval.id);
  const other = newGate(); // another process would do the same with the id alone
  const approved = await other.waitForApproval(decision.approval.id, { timeoutMs: 10000 });
  assert.equal(approved.status, "approved");
  const first = await other.redeem(approved.permit, "wire_money", args);
  assert.equal(first.ok, true);
  const second = await other.redeem(approved.permit, "wire_money", args);
  assert.equal(second.ok, false);
  assert.equal(second.error.code, "already_redeemed");
});

test("rejected approval: the body never runs", live, async () => {
  const gate = newGate();
  let runs = 0;
  const args = { to: "acct-3", amount_minor: 3100 };
  const pending = gate.call("wire_money", args, () => { runs += 1; }, { approvalTimeoutMs: 20000 });
  await review((await pendingFor("3100")).id, "rejected");
  const result = await pending;
  assert.equal(result.status, "approval_rejected");
  assert.equal(runs, 0);
});

test("redeem: a lost response is recovered from the permit's state; the body runs once", live, async () => {
  const proxy = await faultProxy();
  try {
    proxy.plan["POST /v1/permits/redeem"] = ["lose"];
    const gate = newGate(proxy.url);
    let runs = 0;
    const result = await gate.call("read_note", { note_id: "n-2" }, () => { runs += 1; return "ok"; }, { sideEffect: "read" });
    assert.equal(result.status, "executed");
    assert.equal(result.redemption.recovered, true);
    assert.equal(runs, 1);
    assert.equal(proxy.seen.filter((r) => r.path.startsWith("/v1/permits/redeem")).length, 1, "no blind retry");
    assert.ok(proxy.seen.some((r) => r.method === "GET" && r.path.startsWith("/v1/permits/")), "asked the permit's state");
  } finally {
    await proxy.close();
  }
});

test("decide: a lost response is retried under the same request id; one decision", live, async () => {
  const proxy = await faultProxy();
  try {
    proxy.plan["POST /v1/decisions"] = ["lose", "503"];
    const gate = newGate(proxy.url, { timeoutMs: 8000 });
    const decision = await gate.decide("read_note", { note_id: "n-3" });
    assert.equal(decision.effect, "allow");
    const sent = proxy.seen.filter((r) => r.path === "/v1/decisions").map((r) => JSON.parse(r.body).request_id);
    assert.equal(sent.length, 3);
    assert.equal(new Set(sent).size, 1);
    // The server answers the same request id with the first decision.
    const again = await newGate().decide("read_note", { note_id: "n-3" }, { requestId: decision.requestId, run: gate.run });
    assert.equal(again.decisionId, decision.decisionId);
  } finally {
    await proxy.close();
  }
});

test("fail closed: no server → deny `unavailable`, then `breaker_open`; the body never runs", live, async () => {
  const gate = newGate(await closedPort(), { retries: 0, breakerThreshold: 2, breakerCooldownMs: 60000 });
  let runs = 0;
  const codes = [];
  for (let i = 0; i < 3; i++) {
    const r = await gate.call("read_note", { note_id: "n" }, () => { runs += 1; });
    assert.equal(r.status, "denied");
    codes.push(r.code);
  }
  assert.deepEqual(codes, ["unavailable", "unavailable", "breaker_open"]);
  assert.equal(gate.breaker.state, "open");
  assert.equal(runs, 0);
});

test("fail closed: a server that never answers → deny `timeout`; opt-in by name proceeds", live, async () => {
  const stalled = await stalledSocket();
  try {
    const gate = newGate(stalled.url, { timeoutMs: 300, retries: 0, proceedOnTimeout: ["read_note"] });
    const denied = await gate.decide("wire_money", { to: "x", amount_minor: 1 });
    assert.equal(denied.effect, "deny");
    assert.equal(denied.error.code, "timeout");
    const opted = await gate.call("read_note", { note_id: "n" }, () => "ran");
    assert.equal(opted.status, "proceeded_on_timeout");
  } finally {
    await stalled.close();
  }
});

test("invalid arguments are refused before any network call", live, async () => {
  const proxy = await faultProxy();
  try {
    const gate = newGate(proxy.url);
    await assert.rejects(gate.decide("read_note", { id: 2 ** 53 }), { code: "unsafe_integer", pointer: "/id" });
    await assert.rejects(gate.decide("read_note", { x: NaN }), { code: "non_finite_number" });
    assert.equal(proxy.seen.length, 0);
  } finally {
    await proxy.close();
  }
});

test("offline verification: a server permit verifies against the JWKS (alg Ed25519)", live, async () => {
  const gate = newGate();
  const decision = await gate.decide("read_note", NOTE);
  assert.ok(decision.permit, "allow carries a permit");
  const verifier = await PermitVerifier.fromServer(env.url);
  const claims = await verifier.verify(decision.permit.token, { tool: "read_note", args: NOTE, tenant: env.tenant });
  assert.equal(claims.jti, decision.permit.jti);
  await assert.rejects(verifier.verify(decision.permit.token, { tool: "read_note", args: { ...NOTE, weight: 0.2 } }), { code: "args_mismatch" });
  await assert.rejects(verifier.verify(decision.permit.token, { tool: "wire_money", args: NOTE }), { code: "tool_mismatch" });
  await assert.rejects(verifier.verify(decision.permit.token, { tool: "read_note", args: NOTE, tenant: "other" }), { code: "tenant_mismatch" });
  await assert.rejects(verifier.verify(decision.permit.token, { tool: "read_note", args: NOTE, now: claims.exp }), { code: "expired" });
  const [h, p, s] = decision.permit.token.split(".");
  const forged = `${h}.${p}.${s.slice(0, -4)}${s.slice(-4) === "AAAA" ? "BBBB" : "AAAA"}`;
  await assert.rejects(verifier.verify(forged, { tool: "read_note", args: NOTE }), { code: "bad_signature" });
  const empty = new PermitVerifier({ keys: [] });
  await assert.rejects(empty.verify(decision.permit.token, { tool: "read_note", args: NOTE }), { code: "unknown_kid" });
  // The permit is still single use on the server.
  assert.equal((await gate.redeem(decision.permit, "read_note", NOTE)).ok, true);
});

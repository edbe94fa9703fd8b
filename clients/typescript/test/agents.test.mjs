// OpenAI Agents JS (@openai/agents 0.20) tools behind Cosigner, with a scripted custom
// Model, against the live Cosigner; the approval is resumed in a fresh process.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomUUID } from "node:crypto";
import { run } from "@openai/agents";
import { approvalFor } from "../dist/openai-agents.js";
import { makeAgent, ran } from "./agents-fixture.mjs";
import { live, review } from "./helpers.mjs";

const dir = mkdtempSync(join(tmpdir(), "cosigner-agents-"));
const fresh = (call) => {
  const runId = `run-${randomUUID()}`;
  const log = join(dir, `${runId}.log`);
  return { runId, log, call, ...makeAgent({ runId, log, call }) };
};

test("Agents JS: an allowed call runs once; the model reads its output", live, async () => {
  const { agent, log } = fresh({ id: "call_1", name: "read_note", args: { note_id: "n-1" } });
  const result = await run(agent, "read n-1");
  assert.match(result.finalOutput, /read_note ok/);
  assert.deepEqual(ran(log), ['read_note {"note_id":"n-1"}']);
});

test("Agents JS: a denied call never runs; the model reads the refusal", live, async () => {
  const { agent, log, model } = fresh({ id: "call_2", name: "delete_everything", args: { scope: "all" } });
  const result = await run(agent, "clean up");
  assert.deepEqual(ran(log), []);
  assert.match(result.finalOutput, /denied by policy \(destructive_forbidden\)/);
  assert.match(model.inputs.at(-1), /Cosigner did not run this tool call/);
});

test("Agents JS: approval pauses the run; approved in Cosigner, a fresh process resumes from the serialized state and runs it once; a second resume does not", live, async () => {
  const call = { id: "call_3", name: "wire_money", args: { to: "acct-2", amount_minor: 9100 } };
  const { agent, gate, log, runId } = fresh(call);
  const paused = await run(agent, "pay acct-2");
  assert.equal(paused.interruptions.length, 1);
  assert.deepEqual(ran(log), []);
  const approval = await approvalFor(gate, paused.interruptions[0]);
  assert.equal(approval.status, "pending");
  assert.match(approval.reviewUrl, /^https:\/\/cosigner\.example\//);
  const stateFile = join(dir, `${runId}.state`);
  writeFileSync(stateFile, paused.state.toString());

  await review(approval.id); // a human approves in Cosigner

  const resume = () => JSON.parse(execFileSync(process.execPath, [new URL("./agents-resume.mjs", import.meta.url).pathname, stateFile, runId, log, JSON.stringify(call)], { env: process.env, encoding: "utf8" }).trim().split("\n").at(-1));
  const first = resume();
  assert.match(first.finalOutput, /wire_money ok/);
  assert.deepEqual(ran(log), ['wire_money {"to":"acct-2","amount_minor":9100}']);

  const second = resume(); // the same serialized state again: the permit is spent
  assert.match(second.finalOutput, /already_redeemed/);
  assert.equal(ran(log).length, 1);
});

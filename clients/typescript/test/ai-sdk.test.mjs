// Vercel AI SDK (ai 6.x) tools behind Cosigner, driven by the SDK's MockLanguageModelV3
// (a scripted model: no network, no LLM) against the live Cosigner.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { generateText, stepCountIs, tool } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { z } from "zod";
import { Gate } from "../dist/index.js";
import { approvalRequestFor, cosignerTools } from "../dist/ai-sdk.js";
import { ACTORS, env, live, review } from "./helpers.mjs";

const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };

/** A model that proposes `call` first, then answers with text; it records its prompts. */
function scripted(call) {
  const prompts = [];
  const model = new MockLanguageModelV3({
    doGenerate: async (options) => {
      prompts.push(JSON.stringify(options.prompt));
      const sawTool = options.prompt.some((m) => m.role === "tool" && m.content.some((p) => p.type === "tool-result"));
      if (!sawTool) {
        return { content: [{ type: "tool-call", toolCallId: call.id, toolName: call.name, input: JSON.stringify(call.args) }], finishReason: { unified: "tool-calls", raw: undefined }, usage, warnings: [] };
      }
      return { content: [{ type: "text", text: "done" }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] };
    },
  });
  return { model, prompts };
}

function tools(counter) {
  return {
    read_note: tool({ description: "Read a note", inputSchema: z.object({ note_id: z.string() }), execute: async ({ note_id }) => { counter.read_note += 1; return `note ${note_id}`; } }),
    delete_everything: tool({ description: "Delete all", inputSchema: z.object({ scope: z.string() }), execute: async () => { counter.delete_everything += 1; return "deleted"; } }),
    wire_money: tool({ description: "Wire money", inputSchema: z.object({ to: z.string(), amount_minor: z.number().int() }), execute: async ({ to }) => { counter.wire_money += 1; return `sent to ${to}`; } }),
  };
}

const setup = () => {
  const counter = { read_note: 0, delete_everything: 0, wire_money: 0 };
  const gate = new Gate(env.url, env.runtime, { ...ACTORS, run: `run-${randomUUID()}` });
  return { counter, gate, gated: cosignerTools(gate, tools(counter)) };
};

test("AI SDK: an allowed call runs once and the model reads its result", live, async () => {
  const { counter, gated } = setup();
  const { model, prompts } = scripted({ id: "c1", name: "read_note", args: { note_id: "n-1" } });
  const result = await generateText({ model, tools: gated, prompt: "read n-1", stopWhen: stepCountIs(3) });
  assert.equal(result.text, "done");
  assert.equal(counter.read_note, 1);
  assert.match(prompts.at(-1), /note n-1/);
});

test("AI SDK: a denied call never runs; the model reads the refusal", live, async () => {
  const { counter, gated } = setup();
  const { model, prompts } = scripted({ id: "c2", name: "delete_everything", args: { scope: "all" } });
  const result = await generateText({ model, tools: gated, prompt: "clean up", stopWhen: stepCountIs(3) });
  assert.equal(result.text, "done");
  assert.equal(counter.delete_everything, 0);
  assert.match(prompts.at(-1), /Cosigner did not run this tool call: denied by policy \(destructive_forbidden\)/);
});

test("AI SDK: a call needing approval pauses; approved in Cosigner, the resume runs it once; a second resume does not", live, async () => {
  const { counter, gate, gated } = setup();
  const { model } = scripted({ id: "c3", name: "wire_money", args: { to: "acct-1", amount_minor: 4242 } });
  const messages = [{ role: "user", content: "pay acct-1" }];
  const paused = await generateText({ model, tools: gated, messages, stopWhen: stepCountIs(3) });
  const request = paused.content.find((p) => p.type === "tool-approval-request");
  assert.ok(request, "the run paused on the SDK's approval request");
  assert.equal(counter.wire_money, 0);

  const approval = await approvalRequestFor(gate, request);
  assert.equal(approval.status, "pending");
  assert.match(approval.reviewUrl, /^https:\/\/cosigner\.example\//);
  await review(approval.id); // a human approves in Cosigner

  const resumed = [...messages, ...paused.response.messages, { role: "tool", content: [{ type: "tool-approval-response", approvalId: request.approvalId, approved: true }] }];
  const done = await generateText({ model, tools: gated, messages: resumed, stopWhen: stepCountIs(3) });
  assert.equal(done.text, "done");
  assert.equal(counter.wire_money, 1);

  // Replaying the same resume: the permit is spent, the body does not run again.
  const again = await generateText({ model, tools: gated, messages: resumed, stopWhen: stepCountIs(3) });
  assert.equal(counter.wire_money, 1);
  const output = JSON.stringify(again.response.messages);
  assert.match(output, /already_redeemed/);
});

test("AI SDK: site mode shadow runs even a call the policy denies (no pause); off asks nothing", live, async () => {
  const counter = { read_note: 0, delete_everything: 0, wire_money: 0 };
  const gate = new Gate(env.url, env.runtime, { ...ACTORS, run: `run-${randomUUID()}`, modes: { delete_everything: "shadow", wire_money: "off" } });
  const gated = cosignerTools(gate, tools(counter));
  for (const call of [{ id: "s1", name: "delete_everything", args: { scope: "all" } }, { id: "s2", name: "wire_money", args: { to: "acct-1", amount_minor: 5 } }]) {
    const { model, prompts } = scripted(call);
    const result = await generateText({ model, tools: gated, prompt: "go", stopWhen: stepCountIs(3) });
    assert.equal(result.text, "done");
    assert.doesNotMatch(prompts.at(-1), /Cosigner did not run/);
  }
  assert.deepEqual(counter, { read_note: 0, delete_everything: 1, wire_money: 1 });
});

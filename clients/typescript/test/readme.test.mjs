// Every example in README.md runs as written (the URL and the key from the harness; the
// framework examples get a scripted `model` and an `approved(id)` that approves through
// the API as a human would).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { env, live } from "./helpers.mjs";

const README = readFileSync(new URL("../README.md", import.meta.url), "utf8");

function example(name) {
  const m = README.match(new RegExp(`<!-- example:${name}:start -->\\n\`\`\`js\\n([\\s\\S]*?)\`\`\`\\n<!-- example:${name}:end -->`));
  assert.ok(m, `README example ${name}`);
  return m[1].replaceAll("http://127.0.0.1:8080", env.url);
}

function runExample(name, prelude = "") {
  const file = new URL(`./.readme-${name}.mjs`, import.meta.url);
  writeFileSync(file, prelude + "\n" + example(name));
  try {
    return execFileSync(process.execPath, [file.pathname], { env: { ...process.env, COSIGNER_KEY: env.runtime }, encoding: "utf8" });
  } finally {
    rmSync(file);
  }
}

const APPROVE = `import { review } from "./helpers.mjs";\nconst approved = (id) => review(id);\n`;

test("README: the core example", live, () => {
  const out = runExample("core").trim().split("\n");
  assert.deepEqual(out, ["executed note n-1", "denied destructive_forbidden"]);
});

test("README: the Vercel AI SDK example", live, () => {
  const prelude = `${APPROVE}import { MockLanguageModelV3 } from "ai/test";
const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };
const model = new MockLanguageModelV3({ doGenerate: async ({ prompt }) => {
  const result = prompt.flatMap((m) => (m.role === "tool" ? m.content : [])).find((p) => p.type === "tool-result");
  return result
    ? { content: [{ type: "text", text: "model read: " + result.output.value }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] }
    : { content: [{ type: "tool-call", toolCallId: "c1", toolName: "wire_money", input: '{"to":"acct-1","amount_minor":1200}' }], finishReason: { unified: "tool-calls", raw: undefined }, usage, warnings: [] };
} });`;
  const out = runExample("ai-sdk", prelude).trim().split("\n");
  assert.match(out[0], /^review https:\/\/cosigner\.example\//);
  assert.equal(out.at(-1), "model read: sent to acct-1");
});

test("README: the OpenAI Agents JS example", live, () => {
  const prelude = `${APPROVE}import { ScriptedModel } from "./agents-fixture.mjs";
const model = new ScriptedModel({ id: "call_1", name: "wire_money", args: { to: "acct-1", amount_minor: 1300 } });`;
  const out = runExample("openai-agents", prelude).trim().split("\n");
  assert.match(out[0], /^review https:\/\/cosigner\.example\//);
  assert.match(out.at(-1), /sent to acct-1/);
});

test("README (repository root): the TypeScript client example", live, () => {
  const root = readFileSync(new URL("../../../README.md", import.meta.url), "utf8");
  const section = root.slice(root.indexOf("## TypeScript client"));
  const code = section.match(/```js\n([\s\S]*?)```/)[1].replaceAll("http://127.0.0.1:8080", env.url);
  const file = new URL("./.readme-root.mjs", import.meta.url);
  writeFileSync(file, code);
  try {
    const out = execFileSync(process.execPath, [file.pathname], { env: { ...process.env, COSIGNER_KEY: env.runtime }, encoding: "utf8" });
    assert.equal(out.trim(), "executed { order_id: 'ord_8472', charges: 2 }");
  } finally {
    rmSync(file);
  }
});

// An OpenAI Agents JS agent whose model is scripted (a custom Model: no network, no LLM)
// and whose tools are behind Cosigner. Each body run is appended to `log` (a file), so
// runs can be counted across processes.
import { appendFileSync, existsSync, readFileSync } from "node:fs";
import { Agent, Usage } from "@openai/agents";
import { z } from "zod";
import { Gate } from "../dist/index.js";
import { cosignerTool } from "../dist/openai-agents.js";
import { ACTORS, env } from "./helpers.mjs";

/** Proposes `call` until it sees a tool result, then answers with the result's text. */
export class ScriptedModel {
  constructor(call) {
    this.call = call;
    this.inputs = [];
  }
  async getResponse(request) {
    const items = Array.isArray(request.input) ? request.input : [];
    this.inputs.push(JSON.stringify(items));
    const result = items.find((i) => i.type === "function_call_result");
    const output = result
      ? [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: `done: ${JSON.stringify(result.output)}` }] }]
      : [{ type: "function_call", callId: this.call.id, name: this.call.name, arguments: JSON.stringify(this.call.args), status: "completed" }];
    return { usage: new Usage(), output, responseId: `resp-${this.inputs.length}` };
  }
  async *getStreamedResponse() {
    throw new Error("not scripted");
  }
}

export function ran(log) {
  return existsSync(log) ? readFileSync(log, "utf8").split("\n").filter(Boolean) : [];
}

export function makeAgent({ runId, log, call }) {
  const gate = new Gate(env.url, env.runtime, { ...ACTORS, run: runId });
  const body = (name) => async (input) => {
    appendFileSync(log, `${name} ${JSON.stringify(input)}\n`);
    return `${name} ok`;
  };
  const tools = [
    cosignerTool(gate, { name: "read_note", description: "Read a note", parameters: z.object({ note_id: z.string() }), execute: body("read_note") }),
    cosignerTool(gate, { name: "delete_everything", description: "Delete all", parameters: z.object({ scope: z.string() }), execute: body("delete_everything") }),
    cosignerTool(gate, { name: "wire_money", description: "Wire money", parameters: z.object({ to: z.string(), amount_minor: z.number().int() }), execute: body("wire_money") }),
  ];
  const model = new ScriptedModel(call);
  const agent = new Agent({ name: "payments", instructions: "help", model, tools });
  return { gate, agent, model };
}

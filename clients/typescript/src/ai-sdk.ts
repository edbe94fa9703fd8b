/**
 * Vercel AI SDK (`ai` 6.x) tools behind Cosigner.
 *
 * `cosignerTools(gate, tools)` wraps each tool: its `needsApproval` asks Cosigner, so a
 * call that needs a human pauses the run with the SDK's own `tool-approval-request`
 * (the approval id and review link are on `approvalRequestFor`); once the human approved
 * in Cosigner, the app answers the SDK's request with `approved: true` and calls
 * `generateText` again: `execute` then reads the approval, redeems and runs the body
 * exactly once. A denied call never runs; the model reads a refusal string.
 */
import type { Tool, ToolExecutionOptions } from "ai";
import type { Gate } from "./gate.js";
import { decideCall, needsApproval, runGated, type GuardOptions } from "./frameworks.js";
import type { Approval } from "./models.js";

export type { GuardOptions } from "./frameworks.js";

/** One AI SDK tool behind Cosigner (`execute` required). */
export function cosignerTool<INPUT extends Record<string, unknown>, OUTPUT>(gate: Gate, name: string, tool: Tool<INPUT, OUTPUT>, opts: GuardOptions = {}): Tool<INPUT, OUTPUT | string> {
  const execute = tool.execute;
  if (!execute) throw new TypeError(`tool ${name} has no execute function`);
  return {
    ...tool,
    needsApproval: async (input: INPUT, options: { toolCallId: string }) => needsApproval(gate, name, input, options.toolCallId, opts),
    execute: async (input: INPUT, options: ToolExecutionOptions) =>
      runGated(gate, name, input, (args) => execute(args as INPUT, options) as OUTPUT | Promise<OUTPUT>, options.toolCallId, { ...opts, signal: options.abortSignal }),
  } as unknown as Tool<INPUT, OUTPUT | string>;
}

/** Every tool of a tool set behind Cosigner, under its own name. */
export function cosignerTools<T extends Record<string, Tool<any, any>>>(gate: Gate, tools: T, opts: Omit<GuardOptions, "name"> = {}): T {
  return Object.fromEntries(Object.entries(tools).map(([name, t]) => [name, cosignerTool(gate, name, t, opts)])) as T;
}

/** The Cosigner approval behind an SDK `tool-approval-request` (its id, review link). */
export async function approvalRequestFor(gate: Gate, request: { toolCall: { toolName: string; toolCallId: string; input: unknown } }, opts: GuardOptions = {}): Promise<Approval | null> {
  const decision = await decideCall(gate, request.toolCall.toolName, request.toolCall.input as Record<string, unknown>, request.toolCall.toolCallId, opts);
  return decision.approval;
}

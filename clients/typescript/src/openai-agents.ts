/**
 * OpenAI Agents JS (`@openai/agents` 0.20) function tools behind Cosigner.
 *
 * `cosignerTool(gate, options)` takes the options of the SDK's `tool()` and returns the
 * SDK tool with `needsApproval` backed by Cosigner's decision: a call that needs a human
 * becomes an SDK interruption (`result.interruptions`; the approval id and review link
 * via `approvalFor`). Once the human approved in Cosigner, the app calls
 * `state.approve(item)` and runs again — in this process or another one, from
 * `RunState.fromString` — and `execute` reads the approval, redeems and runs the body
 * exactly once. A denied call never runs; the model reads a refusal string.
 *
 * The request id of each decision is derived from the gate's run id, the tool and the
 * SDK's call id: a resuming process must use a gate with the same `run`.
 */
import { tool, type FunctionTool, type RunToolApprovalItem } from "@openai/agents";
import { randomUUID } from "node:crypto";
import type { Gate } from "./gate.js";
import { decideCall, needsApproval, runGated, type GuardOptions } from "./frameworks.js";
import type { Approval } from "./models.js";

export type { GuardOptions } from "./frameworks.js";

type ToolOptions = Parameters<typeof tool>[0];

/** The SDK's `tool(options)`, with every call decided, approved, redeemed and reported. */
export function cosignerTool(gate: Gate, options: ToolOptions, guard: GuardOptions = {}): FunctionTool<any, any, any> {
  const name = options.name ?? "";
  if (!name) throw new TypeError("cosignerTool needs options.name");
  const execute = options.execute as (input: any, ctx: any, details: any) => unknown;
  return tool({
    ...options,
    needsApproval: async (_ctx: unknown, input: any, callId?: string) => needsApproval(gate, name, input, callId ?? randomUUID(), guard),
    execute: async (input: any, ctx: any, details: any) =>
      runGated(gate, name, input, (args) => execute(args, ctx, details), details?.toolCall?.callId ?? randomUUID(), { ...guard, signal: details?.signal }) as any,
  } as ToolOptions) as FunctionTool<any, any, any>;
}

/** The Cosigner approval behind an SDK interruption (its id and review link). */
export async function approvalFor(gate: Gate, item: RunToolApprovalItem, guard: GuardOptions = {}): Promise<Approval | null> {
  const raw = item.rawItem as { name?: string; callId?: string; arguments?: string };
  const args = JSON.parse(raw.arguments ?? "{}");
  const decision = await decideCall(gate, raw.name ?? item.name ?? "", args, raw.callId ?? "", guard);
  return decision.approval;
}

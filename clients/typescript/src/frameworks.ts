/**
 * The framework-neutral half of the adapters: a tool call identified by the framework's
 * call id is decided under a request id derived from (run, tool, call id), so every
 * place the framework asks about the same call — its approval hook, the execution, a
 * resume in another process from serialized state — gets the same server decision and
 * joins the same approval request. The single-use permit makes the body run at most
 * once; a refusal becomes a string result the model can read.
 */
import { createHash } from "node:crypto";
import type { Gate } from "./gate.js";
import type { CallResult, Decision } from "./models.js";

export interface GuardOptions {
  /** The name Cosigner knows the tool by (default: the framework's tool name). */
  name?: string;
  /** The tool's class: none | read | write | financial | destructive. */
  sideEffect?: string;
  /** How long execution waits for an approval not yet given (default: the gate's). */
  approvalTimeoutMs?: number;
  /** The text the model reads when the body did not run (default {@link refusalText}). */
  refusal?: (result: CallResult) => string;
  /** Throw a CallRefused instead of returning the refusal text. */
  throwOnRefusal?: boolean;
}

/** A request id stable for one tool call of one run. */
export function requestIdFor(gate: Gate, tool: string, callId: string): string {
  const run = String(gate.run?.id ?? "");
  return "req-" + createHash("sha256").update(`${run}\u0000${tool}\u0000${callId}`).digest("hex").slice(0, 32);
}

/** What the model reads when the body did not run: status, reason code, review link. */
export function refusalText(result: CallResult): string {
  const review = result.approval?.reviewUrl ?? result.decision.approval?.reviewUrl;
  const reasons = result.decision.reasons.map((r) => r.code).filter(Boolean).join(", ");
  const why =
    result.status === "denied"
      ? `denied by policy (${reasons || result.code})`
      : result.status === "approval_timeout"
        ? `still waiting for approval (${result.code})`
        : result.status.startsWith("approval_")
          ? `not approved: the approval was ${result.approval?.status ?? result.code}`
          : `refused (${result.code})`;
  return `Cosigner did not run this tool call: ${why}.${review ? ` Review: ${review}` : ""} Do not retry it unchanged.`;
}

/** Decide the call (same decision on every ask); the framework's approval hook. */
export async function decideCall(gate: Gate, tool: string, args: Record<string, unknown>, callId: string, opts: GuardOptions = {}): Promise<Decision> {
  return gate.decide(opts.name ?? tool, args, { requestId: requestIdFor(gate, opts.name ?? tool, callId), sideEffect: opts.sideEffect });
}

/** True when the call waits for a human: the framework should pause the run. */
export async function needsApproval(gate: Gate, tool: string, args: Record<string, unknown>, callId: string, opts: GuardOptions = {}): Promise<boolean> {
  if (gate.modeOf(opts.name ?? tool) !== "on") return false; // shadow / off never pause for a human
  const decision = await decideCall(gate, tool, args, callId, opts);
  if (decision.effect !== "require_approval" || !decision.approval) return false;
  // Already decided by a human (e.g. asked again on resume): no need to pause.
  return decision.approval.status === "pending";
}

/** Run every gate around `fn(args)` for one framework tool call; a refusal is a string. */
export async function runGated<T>(
  gate: Gate,
  tool: string,
  args: Record<string, unknown>,
  fn: (args: any) => T | Promise<T>,
  callId: string,
  opts: GuardOptions & { signal?: AbortSignal } = {},
): Promise<T | string> {
  const name = opts.name ?? tool;
  const mode = gate.modeOf(name);
  if (mode !== "on") {
    // Site mode shadow (asked and recorded, always runs) or off (not asked).
    const result = await gate.call(name, args, fn, { requestId: requestIdFor(gate, name, callId), sideEffect: opts.sideEffect, signal: opts.signal, mode });
    return result.value as T;
  }
  const decision = await decideCall(gate, tool, args, callId, opts);
  const result = await gate.proceed(decision, name, args, fn, { sideEffect: opts.sideEffect, approvalTimeoutMs: opts.approvalTimeoutMs, signal: opts.signal });
  if (result.executed) return result.value as T;
  if (opts.throwOnRefusal) result.unwrap();
  return (opts.refusal ?? refusalText)(result);
}

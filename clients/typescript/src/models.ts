/** Typed results of the three gates, built from the server's JSON. */
import { CallRefused, GateError, type ErrorKind } from "./errors.js";

export type Effect = "allow" | "deny" | "require_approval";
export type ApprovalStatus = "pending" | "approved" | "rejected" | "expired" | "cancelled";
export type Outcome = "ok" | "error" | "timeout";
export type SideEffect = "none" | "committed" | "not_executed" | "unknown";
export type Party = string | { id: string; type?: string; [k: string]: unknown };

export interface Reason {
  code: string;
  message: string;
}

export interface Permit {
  token: string;
  jti: string;
  expiresAt: string | null;
}

export interface Approval {
  id: string;
  status: ApprovalStatus;
  require: unknown[];
  progress: unknown[];
  expiresAt: string | null;
  reviewUrl: string | null;
  permit: Permit | null;
  retryAfter: number | null;
  /** Set when the client stopped waiting (`timeout`, `aborted`) or could not ask. */
  error: GateError | null;
}

export interface Decision {
  effect: Effect;
  reasons: Reason[];
  argsHash: string;
  requestId: string;
  /** null when the client made the decision up because the server could not answer. */
  decisionId: string | null;
  policy: Record<string, string> | null;
  permit: Permit | null;
  approval: Approval | null;
  error: GateError | null;
  /** A client-made allow for a tool named in `proceedOnTimeout`. */
  failOpen: boolean;
  /** The fail direction applied when the server could not decide (`deny`, `ask`, `proceed`); absent when it decided. */
  failDirection?: FailDirection | null;
}

export type FailDirection = "deny" | "proceed" | "ask";
export type Mode = "off" | "shadow" | "on";

export interface Redemption {
  ok: boolean;
  jti: string;
  error: GateError | null;
  redeemedAt: string | null;
  /** The response was lost and the permit's state showed the redeem was ours. */
  recovered: boolean;
}

export interface OutcomeReport {
  ok: boolean;
  decisionId: string | null;
  outcome: Outcome;
  sideEffect: SideEffect;
  costMinor: number | null;
  error: GateError | null;
}

export type CallStatus =
  | "executed"
  | "denied"
  | "approval_rejected"
  | "approval_expired"
  | "approval_cancelled"
  | "approval_timeout"
  | "redeem_refused"
  | "proceeded_on_timeout"
  | "approved_by_human_on_failure"
  | "shadow"
  | "off";

function b64urlJson(part: string): any {
  return JSON.parse(Buffer.from(part, "base64url").toString("utf8"));
}

export function permitFromToken(token: string): Permit {
  try {
    const claims = b64urlJson(token.split(".")[1]!);
    if (typeof claims?.jti !== "string") throw new Error();
    return { token, jti: claims.jti, expiresAt: null };
  } catch {
    throw new GateError("not a compact JWS permit", "malformed_permit");
  }
}

export function parsePermit(data: any): Permit | null {
  if (!data || typeof data.token !== "string") return null;
  return { token: data.token, jti: String(data.jti ?? ""), expiresAt: data.expires_at ?? null };
}

export function parseApproval(data: any): Approval {
  return {
    id: String(data.id),
    status: data.status,
    require: data.require ?? [],
    progress: data.progress ?? [],
    expiresAt: data.expires_at ?? null,
    reviewUrl: data.review_url ?? null,
    permit: parsePermit(data.permit),
    retryAfter: data.retry_after ?? null,
    error: null,
  };
}

/** A decision as the server sent it; throws when it is not the documented shape (→ `malformed`). */
export function parseDecision(data: any): Decision {
  if (!data || typeof data !== "object" || !["allow", "deny", "require_approval"].includes(data.effect) || typeof data.args_hash !== "string" || typeof data.request_id !== "string" || (data.reasons !== undefined && !Array.isArray(data.reasons))) {
    throw new TypeError("not a decision");
  }
  const approval = data.approval && typeof data.approval === "object" && "id" in data.approval ? parseApproval(data.approval) : null;
  return {
    effect: data.effect,
    reasons: (data.reasons ?? []).map((r: any) => ({ code: String(r.code ?? ""), message: String(r.message ?? "") })),
    argsHash: data.args_hash,
    requestId: data.request_id,
    decisionId: data.decision_id,
    policy: data.policy ?? null,
    permit: parsePermit(data.permit),
    approval,
    error: null,
    failOpen: false,
  };
}

/** What `call` did: the gates' answers and, when it ran, the tool's value. */
export class CallResult<T = unknown> {
  constructor(
    readonly status: CallStatus,
    readonly decision: Decision,
    readonly value: T | undefined = undefined,
    readonly approval: Approval | null = null,
    readonly redemption: Redemption | null = null,
    readonly outcome: OutcomeReport | null = null,
    /** The fail direction applied when the server could not decide; null when it decided. */
    readonly failDirection: FailDirection | null = null,
  ) {}

  /** The body ran: through the gates, opted in on a failure (`proceed` / a human's yes), or in mode `shadow` / `off`. */
  get executed(): boolean {
    return ["executed", "proceeded_on_timeout", "approved_by_human_on_failure", "shadow", "off"].includes(this.status);
  }

  /** The failure kind that decided this result, if any. */
  get failure(): string | null {
    for (const part of [this.redemption, this.approval, this.decision]) {
      if (part?.error) return part.error.kind;
    }
    return null;
  }

  /** Why the body did not run: the decisive gate's code ("" when it ran). */
  get code(): string {
    if (this.executed) return "";
    if (this.redemption) return this.redemption.ok ? "redeemed" : (this.redemption.error?.code ?? "refused");
    if (this.approval) return this.approval.error ? this.approval.error.code : this.approval.status;
    if (this.decision.error) return this.decision.error.code;
    return this.decision.reasons[0]?.code || this.decision.effect;
  }

  /** The tool's value; throws {@link CallRefused} when it did not run. */
  unwrap(): T {
    if (!this.executed) throw new CallRefused(`${this.status}: ${this.code}`, this.code, { kind: (this.failure ?? "refused") as ErrorKind });
    return this.value as T;
  }
}

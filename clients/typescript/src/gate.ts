/**
 * `Gate`: the three gates of a tool call over HTTP (fetch), with the Python client's
 * guarantees. Failure behaviour (each operation bounded by `timeoutMs`, default 2000):
 *
 * - decide is retried with backoff and jitter under the same `request_id` (the server
 *   answers a retry with the first decision; a 429 / 503 no sooner than its
 *   `Retry-After`, and only while that fits in the deadline); with no usable answer the
 *   decision is `deny` — or, only for tools whose fail direction (`failDirections`,
 *   `proceedOnTimeout`) is `proceed` / `ask` and only for failures where the server could
 *   not decide (`FAIL_OPEN_KINDS`), a client-made `allow` (`failOpen`) / a question to
 *   `askHuman`; the direction taken is `failDirection` in the decision and the result;
 * - site modes (`mode`, `modes`, per call): `shadow` asks with `mode: "shadow"` (no
 *   permit, no approval request) and always runs the tool (status `shadow`); `off` runs
 *   it without asking (status `off`);
 * - waiting for an approval long-polls `GET /v1/approvals/{id}?wait=` and stops at its
 *   own deadline or when the caller's `AbortSignal` fires (error `timeout` / `aborted`);
 * - redeem is retried only when the request provably never left (connect error); after
 *   a timeout or a lost response it asks `GET /v1/permits/{jti}` first: `issued` → redeem
 *   again; `redeemed` by this caller → the lost redeem was ours, proceed once; anything
 *   else, or no answer → do not execute;
 * - outcome reports are retried like decide (an identical report is idempotent);
 * - every attempt is counted by the circuit breaker.
 */
import { randomUUID } from "node:crypto";
import { Breaker } from "./breaker.js";
import { argsHash, checkHashable } from "./canonical.js";
import { ABORTED, BREAKER_OPEN, FAIL_OPEN_KINDS, GateError, GateUnavailable, InvalidArguments, MALFORMED, ServerRefused, TIMEOUT, UNAVAILABLE, kindOfStatus } from "./errors.js";
import {
  CallResult,
  parseApproval,
  parseDecision,
  permitFromToken,
  type Approval,
  type CallStatus,
  type Decision,
  type FailDirection,
  type Mode,
  type Outcome,
  type OutcomeReport,
  type Party,
  type Permit,
  type Redemption,
  type SideEffect,
} from "./models.js";

const SIDE_EFFECTS = new Set(["none", "committed", "not_executed", "unknown"]);
const NO_SIDE_EFFECT = new Set(["none", "read"]);
/** Longest single long-poll asked of the server (it allows up to 60 s). */
const MAX_POLL_MS = 25_000;

export interface GateOptions {
  /** ms per gate operation, retries included (default 2000). */
  timeoutMs?: number;
  /** Extra attempts for decide and outcome reports (same request id). Default 2. */
  retries?: number;
  breakerThreshold?: number;
  breakerCooldownMs?: number;
  /** Default ms `call` waits for a human approval (default 60000). */
  approvalTimeoutMs?: number;
  /** Tool names that may run without a decision when the server cannot answer. */
  proceedOnTimeout?: Iterable<string>;
  run?: Party;
  principal?: Party;
  initiator?: Party;
  /** A fetch implementation (default: the global one). */
  fetch?: typeof fetch;
  /**
   * Per tool: what a failure where the server could not decide (rate_limited,
   * overloaded, timeout, malformed, unavailable, breaker_open) does: `deny` (the
   * default), `proceed` (run without a decision) or `ask` (run only if `askHuman`
   * says yes). auth, invalid, too_large and aborted always deny.
   */
  failDirections?: Record<string, FailDirection>;
  /** Asked for tools whose fail direction is `ask`; only `true` lets the call run. */
  askHuman?: (tool: string, args: Record<string, unknown>, error: GateError) => boolean | Promise<boolean>;
  /** Site mode of every tool: `on` (default), `shadow` (ask, record, always run) or `off` (run, ask nothing). */
  mode?: Mode;
  /** Site mode of named tools (overrides `mode`). */
  modes?: Record<string, Mode>;
}

export interface DecideOptions {
  run?: Party;
  principal?: Party;
  initiator?: Party;
  context?: Record<string, unknown>;
  requestId?: string;
  /** The tool's class: none | read | write | financial | destructive. */
  sideEffect?: string;
  toolVersion?: string;
  /** `shadow`: the decision is recorded as a shadow one (no permit, no approval request). */
  mode?: Mode;
  /** Aborts deciding (error `aborted`). */
  signal?: AbortSignal;
}

export interface CallOptions<T> extends DecideOptions {
  costMinor?: number | ((value: T) => number | null | undefined);
  approvalTimeoutMs?: number;
  /** Aborts the call (deciding or waiting for an approval); the body then does not run. */
  signal?: AbortSignal;
  /** This call's site mode (overrides the gate's `mode` / `modes`). */
  mode?: Mode;
}

type Reply = { ok: true; status: number; data: any; retryAfter: number | null; garbled: boolean };
type Failure = { ok: false; kind: "connect" | "timeout" | "transport" | "breaker_open" | "aborted"; detail: string };
type Result = Reply | Failure;

function partyOf(value: Party | undefined, what: string): Record<string, unknown> {
  if (value === undefined || value === null) throw new InvalidArguments(`${what} is required (pass it to the gate or the call)`, "invalid_request");
  return typeof value === "string" ? { id: value } : { ...value };
}

function runOf(value: Party | Record<string, unknown> | undefined): Record<string, unknown> {
  if (value === undefined || value === null) throw new InvalidArguments("no run: pass run or call startRun() first", "invalid_request");
  return typeof value === "string" ? { id: value } : { ...value };
}

/** The client error for a failed exchange. */
export function errorOf(result: Result): GateError {
  if (!result.ok) {
    const code = result.kind === "timeout" ? TIMEOUT : result.kind === "breaker_open" ? BREAKER_OPEN : result.kind === "aborted" ? ABORTED : UNAVAILABLE;
    return new GateUnavailable(result.detail, code);
  }
  if (result.garbled && result.status < 300) return new GateUnavailable("the server's answer is not JSON", MALFORMED, { status: result.status });
  const data = result.data && typeof result.data === "object" ? result.data : {};
  const detail = String(data.detail || `HTTP ${result.status}`);
  const serverCode = String(data.code || `http_${result.status}`);
  const kind = kindOfStatus(result.status, serverCode);
  if (result.status >= 500) return new GateUnavailable(detail, kind, { status: result.status, serverCode, retryAfter: result.retryAfter });
  return new ServerRefused(detail, serverCode, { status: result.status, kind, retryAfter: result.retryAfter });
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, Math.max(0, ms));
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });

/** `Retry-After` in seconds (delta-seconds or an HTTP date), else null. */
function retryAfterOf(value: string | null): number | null {
  if (!value) return null;
  const secs = Number(value);
  if (Number.isFinite(secs)) return Math.max(0, secs);
  const at = Date.parse(value);
  return Number.isNaN(at) ? null : Math.max(0, (at - Date.now()) / 1000);
}

function isConnectError(err: unknown): boolean {
  const cause = (err as { cause?: { code?: string } })?.cause;
  const code = cause?.code ?? (err as { code?: string })?.code;
  return ["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "UND_ERR_CONNECT_TIMEOUT", "EHOSTUNREACH", "ENETUNREACH"].includes(String(code));
}

function checkedMode(mode: unknown): Mode {
  if (mode !== "off" && mode !== "shadow" && mode !== "on") throw new TypeError(`mode must be one of off, shadow, on (got ${String(mode)})`);
  return mode;
}

export class Gate {
  readonly url: string;
  readonly breaker: Breaker;
  readonly timeoutMs: number;
  readonly retries: number;
  readonly approvalTimeoutMs: number;
  readonly proceedOnTimeout: ReadonlySet<string>;
  readonly failDirections: Readonly<Record<string, FailDirection>>;
  readonly askHuman: GateOptions["askHuman"];
  readonly mode: Mode;
  readonly modes: Readonly<Record<string, Mode>>;
  principal: Party | undefined;
  initiator: Party | undefined;
  /** The default run of this gate's decisions (set by `startRun`). */
  run: Record<string, unknown> | undefined;
  private readonly apiKey: string;
  private readonly fetchImpl: typeof fetch;

  constructor(url: string, apiKey: string, options: GateOptions = {}) {
    this.url = url.replace(/\/+$/, "");
    this.apiKey = apiKey;
    this.timeoutMs = options.timeoutMs ?? 2000;
    this.retries = options.retries ?? 2;
    this.approvalTimeoutMs = options.approvalTimeoutMs ?? 60_000;
    this.breaker = new Breaker(options.breakerThreshold ?? 5, options.breakerCooldownMs ?? 10_000);
    if (typeof options.proceedOnTimeout === "string") throw new TypeError("proceedOnTimeout takes a collection of tool names");
    this.proceedOnTimeout = new Set(options.proceedOnTimeout ?? []);
    const directions: Record<string, FailDirection> = { ...(options.failDirections ?? {}) };
    for (const [tool, d] of Object.entries(directions)) {
      if (!["deny", "proceed", "ask"].includes(d)) throw new TypeError(`fail direction of ${tool} must be deny, proceed or ask (got ${String(d)})`);
    }
    for (const tool of this.proceedOnTimeout) directions[tool] ??= "proceed";
    if (Object.values(directions).includes("ask") && !options.askHuman) throw new TypeError("a tool whose fail direction is 'ask' needs askHuman");
    this.failDirections = directions;
    this.askHuman = options.askHuman;
    const opened = Object.keys(directions).filter((t) => directions[t] !== "deny").sort();
    if (opened.length) console.warn(`cosigner gate may run without a decision (fail direction proceed/ask) for: ${opened.join(", ")}`);
    this.mode = checkedMode(options.mode ?? "on");
    this.modes = Object.fromEntries(Object.entries(options.modes ?? {}).map(([t, m]) => [t, checkedMode(m)]));
    this.principal = options.principal;
    this.initiator = options.initiator;
    this.run = options.run === undefined ? undefined : runOf(options.run);
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  // ------------------------------------------------------------------ exchange

  private backoff(attempt: number): number {
    const cap = Math.min(500, 50 * 2 ** attempt);
    return cap / 2 + Math.random() * (cap / 2);
  }

  private get attemptMs(): number {
    return this.retries ? this.timeoutMs / 2 : this.timeoutMs;
  }

  private async once(method: string, path: string, body: unknown, params: Record<string, string> | undefined, timeoutMs: number, signal?: AbortSignal): Promise<Result> {
    const controller = new AbortController();
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      controller.abort();
    }, Math.max(1, timeoutMs));
    const onAbort = () => controller.abort();
    signal?.addEventListener("abort", onAbort, { once: true });
    const query = params ? "?" + new URLSearchParams(params).toString() : "";
    const headers: Record<string, string> = { Authorization: `Bearer ${this.apiKey}`, "User-Agent": "cosigner-client-ts/0.1" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    try {
      const resp = await this.fetchImpl(this.url + path + query, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: controller.signal,
      });
      const text = await resp.text();
      let data: any = null;
      let garbled = false;
      try {
        data = text ? JSON.parse(text) : null;
      } catch {
        data = null;
        garbled = true;
      }
      return { ok: true, status: resp.status, data, retryAfter: retryAfterOf(resp.headers.get("retry-after")), garbled };
    } catch (err) {
      const name = (err as Error)?.name ?? "Error";
      if (signal?.aborted && !timedOut) return { ok: false, kind: "aborted", detail: "aborted by the caller" };
      if (timedOut) return { ok: false, kind: "timeout", detail: "the server did not answer in time" };
      if (isConnectError(err)) return { ok: false, kind: "connect", detail: `could not connect to the server (${name})` };
      return { ok: false, kind: "transport", detail: `the connection failed (${name})` };
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    }
  }

  /** One request with retries (5xx / no answer) until `deadline` (performance.now ms). */
  private async exchange(
    method: string,
    path: string,
    opts: { body?: unknown; params?: Record<string, string>; deadline: number; retries?: number; unsentOnly?: boolean; extraMs?: number; signal?: AbortSignal },
  ): Promise<Result> {
    let attempt = 0;
    for (;;) {
      if (opts.signal?.aborted) return { ok: false, kind: "aborted", detail: "aborted by the caller" };
      if (!this.breaker.allow()) return { ok: false, kind: "breaker_open", detail: "circuit breaker is open; not asking the server" };
      const remaining = opts.deadline - performance.now();
      if (remaining <= 0) return { ok: false, kind: "timeout", detail: "the gate's timeout passed" };
      const result = await this.once(method, path, opts.body, opts.params, Math.min(remaining, this.attemptMs) + (opts.extraMs ?? 0), opts.signal);
      if (!result.ok && result.kind === "aborted") return result; // the caller's doing, not the server's
      const failed = !result.ok || result.status >= 500;
      this.breaker.record(!failed);
      const limited = result.ok && result.status === 429;
      if (!failed && !limited) return result;
      // A 429 was refused before any work, so even a redeem may ask again.
      const retryable = limited || !opts.unsentOnly || (!result.ok && result.kind === "connect");
      let delay = this.backoff(attempt);
      // The server said when; not sooner (and only while it fits in the deadline).
      if (result.ok && result.retryAfter !== null) delay = Math.max(delay, result.retryAfter * 1000);
      if (attempt >= (opts.retries ?? 0) || !retryable || performance.now() + delay >= opts.deadline) return result;
      await sleep(delay, opts.signal);
      attempt += 1;
    }
  }

  private deadline(): number {
    return performance.now() + this.timeoutMs;
  }

  // ------------------------------------------------------------------ decide

  /**
   * Ask whether `tool(args)` may run. Never throws for server or network trouble (→
   * `deny` with `error`); throws {@link InvalidArguments} before any network call for
   * arguments the server would refuse.
   */
  async decide(tool: string, args: Record<string, unknown>, opts: DecideOptions = {}): Promise<Decision> {
    if (args === null || typeof args !== "object" || Array.isArray(args)) throw new InvalidArguments("args must be a JSON object", "invalid_args");
    const aHash = argsHash(args); // throws before any network call
    const toolRef: Record<string, unknown> = { name: tool };
    if (opts.sideEffect !== undefined) toolRef.side_effect = opts.sideEffect;
    if (opts.toolVersion !== undefined) toolRef.version = opts.toolVersion;
    const body = {
      request_id: opts.requestId ?? `req-${randomUUID().replace(/-/g, "")}`,
      run: runOf(opts.run ?? this.run),
      principal: partyOf(opts.principal ?? this.principal, "principal"),
      initiator: partyOf(opts.initiator ?? this.initiator, "initiator"),
      tool: toolRef,
      args,
      context: { ...(opts.context ?? {}) },
    } as Record<string, any> & { request_id: string };
    if (opts.mode === "shadow") body.mode = "shadow"; // recorded as such; the server mints no permit for it
    checkHashable(body); // context, run and parties obey the same strict rules
    const result = await this.exchange("POST", "/v1/decisions", { body, deadline: this.deadline(), retries: this.retries, signal: opts.signal });
    const made = (effect: "allow" | "deny", error: GateError, extra: Partial<Decision> = {}): Decision => ({
      effect,
      reasons: [{ code: error.code, message: error.detail }],
      argsHash: aHash,
      requestId: body.request_id,
      decisionId: null,
      policy: null,
      permit: null,
      approval: null,
      error,
      failOpen: false,
      ...extra,
    });
    let error: GateError;
    if (result.ok && result.status === 200 && !result.garbled) {
      let decision: Decision | null = null;
      try {
        decision = parseDecision(result.data);
      } catch {
        decision = null;
      }
      if (decision) {
        if (decision.argsHash !== aHash) {
          // The server hashed something else: fail closed.
          return made("deny", new GateError("server args_hash differs from the client's", "args_hash_mismatch"), { decisionId: decision.decisionId });
        }
        return decision;
      }
      error = new GateUnavailable("the server's answer to decide is not the documented shape", MALFORMED, { status: 200 });
    } else {
      error = errorOf(result);
    }
    const direction: FailDirection = FAIL_OPEN_KINDS.has(error.kind) ? (this.failDirections[tool] ?? "deny") : "deny";
    if (direction === "proceed") {
      return { ...made("allow", error), failOpen: true, failDirection: "proceed", reasons: [{ code: "proceeded_on_timeout", message: `server ${error.code}; ${tool} opted in by name` }] };
    }
    if (direction === "ask") {
      return { ...made("deny", error), effect: "require_approval", failDirection: "ask", reasons: [{ code: "ask_human_on_failure", message: `server ${error.code}; ${tool} asks a person` }] };
    }
    return made("deny", error, { failDirection: "deny" });
  }

  // ------------------------------------------------------------------ approvals

  /**
   * Long-poll the approval until it leaves `pending`, `timeoutMs` pass (error
   * `timeout`), or `signal` aborts (error `aborted`). Accepts a decision, an approval
   * or an approval id (resume from the id alone, e.g. in another process).
   */
  async waitForApproval(approval: Decision | Approval | string, opts: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<Approval> {
    let last: Approval;
    if (typeof approval === "string") {
      last = parseApproval({ id: approval, status: "pending" });
    } else if ("effect" in approval) {
      if (!approval.approval) throw new InvalidArguments("decision has no approval request", "invalid_request");
      last = approval.approval;
    } else {
      last = approval;
    }
    const deadline = performance.now() + (opts.timeoutMs ?? this.approvalTimeoutMs);
    let attempt = 0;
    for (;;) {
      if (opts.signal?.aborted) return { ...last, error: new GateUnavailable("stopped waiting: aborted by the caller", ABORTED) };
      const remaining = deadline - performance.now();
      if (remaining <= 0) return { ...last, error: new GateUnavailable("stopped waiting for the approval", TIMEOUT) };
      const waitMs = Math.min(remaining, MAX_POLL_MS);
      const started = performance.now();
      const result = await this.exchange("GET", `/v1/approvals/${encodeURIComponent(last.id)}`, {
        params: { wait: (Math.round(waitMs) / 1000).toFixed(3) },
        deadline: performance.now() + Math.min(remaining, this.timeoutMs),
        extraMs: waitMs,
        signal: opts.signal,
      });
      if (result.ok && result.status === 200) {
        attempt = 0;
        last = parseApproval(result.data);
        if (last.status !== "pending") return last;
        if (performance.now() - started < waitMs / 2) {
          // The server did not hold the poll.
          await sleep(Math.min((last.retryAfter ?? 1) * 1000, Math.max(deadline - performance.now(), 0)), opts.signal);
        }
        continue;
      }
      const error = errorOf(result);
      if (error instanceof ServerRefused || error.code === BREAKER_OPEN || error.code === ABORTED) return { ...last, error };
      // 5xx or no answer mid-poll: keep trying until the deadline, never proceed.
      await sleep(Math.min(this.backoff(attempt), Math.max(deadline - performance.now(), 0)), opts.signal);
      attempt += 1;
    }
  }

  // ------------------------------------------------------------------ redeem

  /** The permit's state (`GET /v1/permits/{jti}`), or the error. */
  async permitState(jti: string): Promise<Record<string, any> | GateError> {
    const result = await this.exchange("GET", `/v1/permits/${encodeURIComponent(jti)}`, { deadline: this.deadline(), retries: this.retries });
    if (result.ok && result.status === 200) return result.data;
    return errorOf(result);
  }

  /** Redeem a permit for exactly `tool(args)` right before running it. */
  async redeem(permit: Permit | string, tool: string, args: Record<string, unknown>): Promise<Redemption> {
    if (args === null || typeof args !== "object" || Array.isArray(args)) throw new InvalidArguments("args must be a JSON object", "invalid_args");
    checkHashable(args);
    const p = typeof permit === "string" ? permitFromToken(permit) : permit;
    const body = { permit: p.token, tool, args };
    const refused = (error: GateError): Redemption => ({ ok: false, jti: p.jti, error, redeemedAt: null, recovered: false });
    let error: GateError = new GateUnavailable("redeem did not complete", UNAVAILABLE);
    for (let attempt = 0; attempt < 2; attempt++) {
      const result = await this.exchange("POST", "/v1/permits/redeem", { body, unsentOnly: true, deadline: this.deadline(), retries: this.retries });
      if (result.ok && result.status >= 200 && result.status < 300) {
        return { ok: true, jti: p.jti, error: null, redeemedAt: result.data?.redeemed_at ?? null, recovered: false };
      }
      error = errorOf(result);
      const maybeOurs =
        (!result.ok && (result.kind === "timeout" || result.kind === "transport")) ||
        (result.ok && result.status >= 500) ||
        (attempt > 0 && error.code === "already_redeemed");
      if (!maybeOurs) return refused(error);
      // The request may have been processed: ask before doing anything else.
      const state = await this.permitState(p.jti);
      if (state instanceof GateError) {
        return refused(new GateUnavailable(`redeem outcome unknown (${error.code}); not executing`, state.code === TIMEOUT || state.code === BREAKER_OPEN ? state.code : UNAVAILABLE));
      }
      if (state.status === "redeemed") {
        if (state.redeemed_by_you) return { ok: true, jti: p.jti, error: null, redeemedAt: state.redeemed_at ?? null, recovered: true };
        return refused(new ServerRefused("permit was already redeemed", "already_redeemed"));
      }
      if (state.status !== "issued") return refused(new ServerRefused(`permit is ${state.status}`, String(state.status)));
      // Still issued: the lost request did not redeem it; one more try.
    }
    return refused(error);
  }

  // ------------------------------------------------------------------ report

  /** Report `ok | error | timeout` and `none | committed | not_executed | unknown`. */
  async reportOutcome(decision: Decision | string, outcome: Outcome, sideEffect: SideEffect, opts: { costMinor?: number | null } = {}): Promise<OutcomeReport> {
    const decisionId = typeof decision === "string" ? decision : decision.decisionId;
    if (!["ok", "error", "timeout"].includes(outcome) || !SIDE_EFFECTS.has(sideEffect)) {
      throw new InvalidArguments("outcome must be ok|error|timeout and sideEffect none|committed|not_executed|unknown", "invalid_request");
    }
    const costMinor = opts.costMinor ?? null;
    const report = (ok: boolean, error: GateError | null): OutcomeReport => ({ ok, decisionId, outcome, sideEffect, costMinor, error });
    if (!decisionId) return report(false, new GateError("no server decision to report on", "no_decision"));
    const body: Record<string, unknown> = { outcome, side_effect: sideEffect };
    if (costMinor !== null) body.cost_minor = costMinor;
    checkHashable(body);
    const result = await this.exchange("POST", `/v1/decisions/${encodeURIComponent(decisionId)}/outcome`, { body, deadline: this.deadline(), retries: this.retries });
    const ok = result.ok && result.status === 200;
    return report(ok, ok ? null : errorOf(result));
  }

  // ------------------------------------------------------------------ run contract

  /** Register a run contract and make it this gate's run. Throws a GateError on failure. */
  async startRun(runId?: string, opts: { allowedTools?: string[]; toolLimits?: Record<string, number>; maxToolCalls?: number; maxCost?: number; deadline?: Date | string } = {}): Promise<Record<string, any>> {
    const id = runId ?? `run-${randomUUID().replace(/-/g, "")}`;
    const deadline = opts.deadline instanceof Date ? opts.deadline.toISOString() : (opts.deadline ?? null);
    const body = {
      run_id: id,
      allowed_tools: opts.allowedTools ? [...opts.allowedTools].sort() : null,
      tool_limits: { ...(opts.toolLimits ?? {}) },
      budget: { max_tool_calls: opts.maxToolCalls ?? null, max_cost: opts.maxCost ?? null },
      deadline,
    };
    checkHashable(body);
    const result = await this.exchange("POST", "/v1/runs", { body, deadline: this.deadline(), retries: this.retries });
    if (result.ok && (result.status === 200 || result.status === 201)) {
      this.run = { id };
      return result.data;
    }
    throw errorOf(result);
  }

  // ------------------------------------------------------------------ all gates

  /**
   * decide → (wait for approval) → redeem → `fn(args)` → report. `fn` runs only after a
   * successful redeem. An exception from `fn` is reported (`error`, side effect `unknown`
   * unless the exception has a `sideEffect` property) and re-thrown.
   */
  async call<T>(tool: string, args: Record<string, unknown>, fn: (args: any) => T | Promise<T>, opts: CallOptions<T> = {}): Promise<CallResult<T>> {
    const { costMinor: _c, approvalTimeoutMs: _a, mode: callMode, ...decideOpts } = opts;
    const mode = checkedMode(callMode ?? this.modeOf(tool));
    if (mode === "off") {
      // Cosigner is not asked and nothing is recorded.
      const decision: Decision = { effect: "allow", reasons: [{ code: "mode_off", message: "site mode off" }], argsHash: "", requestId: "", decisionId: null, policy: null, permit: null, approval: null, error: null, failOpen: false };
      return new CallResult<T>("off", decision, await fn(args));
    }
    if (mode === "shadow") {
      let decision: Decision;
      try {
        decision = await this.decide(tool, args, { ...decideOpts, mode: "shadow" });
      } catch (exc) {
        if (!(exc instanceof InvalidArguments)) throw exc;
        // Would have been refused (422): still run it.
        decision = { effect: "deny", reasons: [{ code: exc.code, message: exc.detail }], argsHash: "", requestId: "", decisionId: null, policy: null, permit: null, approval: null, error: exc, failOpen: false };
      }
      return new CallResult<T>("shadow", decision, await fn(args));
    }
    const result = await this.proceed(await this.decide(tool, args, decideOpts), tool, args, fn, opts);
    if (result.status === "proceeded_on_timeout" || result.status === "approved_by_human_on_failure") {
      console.warn(`${result.decision.requestId} ran WITHOUT a server decision (${result.failure}; fail direction ${result.failDirection})`);
    }
    return result;
  }

  /** The site mode of `tool`: its entry in `modes`, else the gate's `mode`. */
  modeOf(tool: string): Mode {
    return this.modes[tool] ?? this.mode;
  }

  /**
   * The gates after decide, for a decision already made (e.g. by a framework's
   * approval hook): (wait for approval) → redeem → `fn(args)` → report. Deciding again
   * under the same `requestId` gives the same decision, so a resumed run (even in
   * another process) joins its pending approval, and its single-use permit makes the
   * body run at most once.
   */
  async proceed<T>(decision: Decision, tool: string, args: Record<string, unknown>, fn: (args: any) => T | Promise<T>, opts: CallOptions<T> = {}): Promise<CallResult<T>> {
    const { costMinor, approvalTimeoutMs, signal } = opts;
    if (decision.failDirection === "ask" && decision.error) {
      let yes = false;
      try {
        yes = this.askHuman ? (await this.askHuman(tool, { ...args }, decision.error)) === true : false;
      } catch {
        yes = false;
      }
      if (!yes) return new CallResult<T>("denied", decision, undefined, null, null, null, "ask");
      return new CallResult<T>("approved_by_human_on_failure", decision, await fn(args), null, null, null, "ask");
    }
    if (decision.failOpen) {
      return new CallResult<T>("proceeded_on_timeout", decision, await fn(args), null, null, null, "proceed");
    }
    if (decision.effect === "deny") return new CallResult<T>("denied", decision, undefined, null, null, null, decision.failDirection ?? null);
    let permit = decision.permit;
    let approval: Approval | null = null;
    if (decision.effect === "require_approval") {
      if (!decision.approval) return new CallResult<T>("denied", decision);
      approval = await this.waitForApproval(decision, { timeoutMs: approvalTimeoutMs, signal });
      if (!(approval.status === "approved" && approval.permit)) {
        const status: CallStatus =
          approval.status === "pending" ? "approval_timeout" : approval.status === "rejected" ? "approval_rejected" : approval.status === "expired" ? "approval_expired" : "approval_cancelled";
        return new CallResult<T>(status, decision, undefined, approval);
      }
      permit = approval.permit;
    }
    if (!permit) return new CallResult<T>("denied", decision, undefined, approval);
    const redemption = await this.redeem(permit, tool, args);
    if (!redemption.ok) {
      const report = await this.reportOutcome(decision, "error", "not_executed");
      return new CallResult<T>("redeem_refused", decision, undefined, approval, redemption, report);
    }
    let value: T;
    try {
      value = await fn(args);
    } catch (exc) {
      const declared = (exc as { sideEffect?: string })?.sideEffect;
      const isTimeout = (exc as Error)?.name === "TimeoutError";
      await this.reportOutcome(decision, isTimeout ? "timeout" : "error", (declared && SIDE_EFFECTS.has(declared) ? declared : "unknown") as SideEffect);
      throw exc;
    }
    const cost = typeof costMinor === "function" ? (costMinor(value) ?? null) : (costMinor ?? null);
    const done: SideEffect = NO_SIDE_EFFECT.has(opts.sideEffect ?? "") ? "none" : "committed";
    const report = await this.reportOutcome(decision, "ok", done, { costMinor: cost });
    return new CallResult<T>("executed", decision, value, approval, redemption, report);
  }
}

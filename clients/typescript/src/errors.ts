/**
 * Errors as data, with stable codes: the server's problem codes (`validation_failed`,
 * `args_mismatch`, `already_redeemed`, `expired`, ...) plus the client's own
 * `unavailable`, `timeout`, `breaker_open`, `aborted`, `overloaded` and `malformed`.
 * Every error also has a `kind`, one of {@link FAILURE_KINDS} (or `refused`), to branch on.
 *
 * Only {@link InvalidArguments} (a programming error, thrown before any network call)
 * and {@link CallRefused} (asked for by `unwrap()`) are thrown; every other failure is
 * returned inside a result (`decision.error`, `redemption.error`, ...).
 */

export const UNAVAILABLE = "unavailable";
export const TIMEOUT = "timeout";
export const BREAKER_OPEN = "breaker_open";
export const ABORTED = "aborted";
export const OVERLOADED = "overloaded";
export const MALFORMED = "malformed";
export const AUTH = "auth";
export const INVALID = "invalid";
export const RATE_LIMITED = "rate_limited";
export const TOO_LARGE = "too_large";
/** A server answer about this call (404/409), not a failure of asking. */
export const REFUSED = "refused";

/**
 * Every failure's kind (the Python client's FAILURE_KINDS): auth (401/403), invalid
 * (400/422), rate_limited (429), overloaded (503 `overloaded`), timeout, aborted,
 * malformed (not JSON / not the documented shape), too_large (413), unavailable (no
 * connection, other 5xx), breaker_open. `refused` is a server answer (404/409).
 */
export type FailureKind =
  | "auth" | "invalid" | "rate_limited" | "overloaded" | "timeout" | "aborted"
  | "malformed" | "too_large" | "unavailable" | "breaker_open";
export type ErrorKind = FailureKind | "refused";

export const FAILURE_KINDS: ReadonlySet<FailureKind> = new Set<FailureKind>([
  "auth", "invalid", "rate_limited", "overloaded", "timeout", "aborted", "malformed", "too_large", "unavailable", "breaker_open",
]);
/** Failures where the server could not decide: a tool may opt in to `proceed` / `ask`. */
export const FAIL_OPEN_KINDS: ReadonlySet<string> = new Set(["rate_limited", "overloaded", "timeout", "malformed", "unavailable", "breaker_open"]);

/** The failure kind of an HTTP error status. */
export function kindOfStatus(status: number, serverCode = ""): ErrorKind {
  if (status === 401 || status === 403) return AUTH;
  if (status === 400 || status === 422) return INVALID;
  if (status === 413) return TOO_LARGE;
  if (status === 429) return RATE_LIMITED;
  if (status === 503 && serverCode === OVERLOADED) return OVERLOADED;
  if (status >= 500) return UNAVAILABLE;
  return REFUSED;
}

export class GateError extends Error {
  readonly code: string;
  readonly detail: string;
  readonly status: number | null;
  /** One of the ten failure kinds ({@link FAILURE_KINDS}), or `refused`. */
  readonly kind: ErrorKind;
  /** Seconds the server asked to wait (`Retry-After` of a 429 / 503), else null. */
  readonly retryAfter: number | null;
  /** JSON pointer of the offending place (InvalidArguments), else "". */
  readonly pointer: string;
  /** The server's own code behind a 5xx (`unavailable`). */
  readonly serverCode: string | null;

  constructor(detail: string, code: string, opts: { status?: number | null; pointer?: string; serverCode?: string | null; kind?: ErrorKind; retryAfter?: number | null } = {}) {
    super(detail || code);
    this.code = code;
    this.detail = detail || code;
    this.status = opts.status ?? null;
    this.pointer = opts.pointer ?? "";
    this.serverCode = opts.serverCode ?? null;
    this.retryAfter = opts.retryAfter ?? null;
    this.kind = opts.kind ?? (FAILURE_KINDS.has(code as FailureKind) ? (code as FailureKind) : (new.target as { defaultKind?: ErrorKind }).defaultKind ?? REFUSED);
    this.name = new.target.name;
  }

  toJSON(): { code: string; kind: ErrorKind; detail: string; status: number | null } {
    return { code: this.code, kind: this.kind, detail: this.detail, status: this.status };
  }
}

/** Thrown before any network call: arguments the server would refuse. */
export class InvalidArguments extends GateError {
  static defaultKind: ErrorKind = INVALID;
}

/** A 4xx problem from the server, with the server's code. */
export class ServerRefused extends GateError {}

/** The server could not be asked or did not answer (treat as deny). */
export class GateUnavailable extends GateError {
  static defaultKind: ErrorKind = UNAVAILABLE;
}

/** Thrown by `CallResult.unwrap()` when the tool body did not run. */
export class CallRefused extends GateError {}

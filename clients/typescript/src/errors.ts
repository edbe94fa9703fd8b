/**
 * Errors as data, with stable codes: the server's problem codes (`validation_failed`,
 * `args_mismatch`, `already_redeemed`, `expired`, ...) plus the client's own
 * `unavailable`, `timeout`, `breaker_open` and `aborted`.
 *
 * Only {@link InvalidArguments} (a programming error, thrown before any network call)
 * and {@link CallRefused} (asked for by `unwrap()`) are thrown; every other failure is
 * returned inside a result (`decision.error`, `redemption.error`, ...).
 */

export const UNAVAILABLE = "unavailable";
export const TIMEOUT = "timeout";
export const BREAKER_OPEN = "breaker_open";
export const ABORTED = "aborted";

export type ErrorKind = "invalid_arguments" | "server_refused" | "unavailable" | "call_refused" | "gate_error";

export class GateError extends Error {
  readonly code: string;
  readonly detail: string;
  readonly status: number | null;
  readonly kind: ErrorKind = "gate_error";
  /** JSON pointer of the offending place (InvalidArguments), else "". */
  readonly pointer: string;
  /** The server's own code behind a 5xx (`unavailable`). */
  readonly serverCode: string | null;

  constructor(detail: string, code: string, opts: { status?: number | null; pointer?: string; serverCode?: string | null } = {}) {
    super(detail || code);
    this.code = code;
    this.detail = detail || code;
    this.status = opts.status ?? null;
    this.pointer = opts.pointer ?? "";
    this.serverCode = opts.serverCode ?? null;
    this.name = new.target.name;
  }

  toJSON(): { code: string; detail: string; status: number | null } {
    return { code: this.code, detail: this.detail, status: this.status };
  }
}

/** Thrown before any network call: arguments the server would refuse. */
export class InvalidArguments extends GateError {
  override readonly kind = "invalid_arguments" as const;
}

/** A 4xx problem from the server, with the server's code. */
export class ServerRefused extends GateError {
  override readonly kind = "server_refused" as const;
}

/** The server could not be asked or did not answer (treat as deny). */
export class GateUnavailable extends GateError {
  override readonly kind = "unavailable" as const;
}

/** Thrown by `CallResult.unwrap()` when the tool body did not run. */
export class CallRefused extends GateError {
  override readonly kind = "call_refused" as const;
}

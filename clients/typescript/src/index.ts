export { Gate, errorOf, type GateOptions, type DecideOptions, type CallOptions } from "./gate.js";
export { Breaker, type BreakerState } from "./breaker.js";
export { argsHash, argsHashOfJson, canonicalize, checkHashable, parseJson, MAX_SAFE_INTEGER, type Json } from "./canonical.js";
export { GateError, InvalidArguments, ServerRefused, GateUnavailable, CallRefused, UNAVAILABLE, TIMEOUT, BREAKER_OPEN, ABORTED, OVERLOADED, MALFORMED, AUTH, INVALID, RATE_LIMITED, TOO_LARGE, REFUSED, FAILURE_KINDS, FAIL_OPEN_KINDS, kindOfStatus, type ErrorKind, type FailureKind } from "./errors.js";
export {
  CallResult,
  permitFromToken,
  type Approval,
  type ApprovalStatus,
  type CallStatus,
  type Decision,
  type Effect,
  type FailDirection,
  type Mode,
  type Outcome,
  type OutcomeReport,
  type Party,
  type Permit,
  type Reason,
  type Redemption,
  type SideEffect,
} from "./models.js";
export { decideCall, needsApproval, refusalText, requestIdFor, runGated, type GuardOptions } from "./frameworks.js";
export { PermitVerifier, ALGORITHM, PERMIT_TYP } from "./verify.js";

/**
 * A circuit breaker: `closed` → (`threshold` consecutive failed attempts) → `open`: every
 * request fails at once with `breaker_open` → (`cooldown` ms) → `half_open`: one probe
 * is let through; its success closes the breaker, its failure opens it again. A failure
 * is a transport error, a timeout or a 5xx; any other answer (even a 4xx) proves the
 * server is up.
 */
export type BreakerState = "closed" | "open" | "half_open";

export class Breaker {
  private _state: BreakerState = "closed";
  private failures = 0;
  private since = 0;

  constructor(
    readonly threshold: number,
    readonly cooldownMs: number,
    private readonly clock: () => number = () => performance.now(),
  ) {
    if (threshold < 1 || cooldownMs <= 0) throw new RangeError("breaker threshold must be >= 1 and cooldown > 0");
  }

  get state(): BreakerState {
    if (this._state === "open" && this.clock() - this.since >= this.cooldownMs) return "half_open";
    return this._state;
  }

  /** May a request be sent now? (In `half_open`, one probe at a time.) */
  allow(): boolean {
    if (this._state === "closed") return true;
    const now = this.clock();
    if (now - this.since < this.cooldownMs) return false;
    this._state = "half_open";
    this.since = now;
    return true;
  }

  record(ok: boolean): void {
    if (ok) {
      this._state = "closed";
      this.failures = 0;
      return;
    }
    this.failures += 1;
    if (this._state === "half_open" || this.failures >= this.threshold) {
      this._state = "open";
      this.since = this.clock();
    }
  }
}

/**
 * Offline permit verification against the server's JWKS (`GET /.well-known/jwks.json`)
 * with `jose` (its JWS algorithm `Ed25519`, RFC 9864; `EdDSA` is not accepted).
 *
 * Checks the signature (the key chosen by `kid` from the JWKS only), `typ`, issuer,
 * audience, `exp`/`nbf` (expired when now >= exp), tenant, tool and the args hash of
 * the exact arguments. It cannot know whether the permit was already redeemed or
 * revoked: single use needs `Gate.redeem`; use this as an extra check, not instead.
 */
import { timingSafeEqual } from "node:crypto";
import { compactVerify, decodeProtectedHeader, importJWK, type JWK } from "jose";
import { argsHash } from "./canonical.js";
import { ServerRefused } from "./errors.js";

export const ALGORITHM = "Ed25519";
export const PERMIT_TYP = "cosigner-permit+jwt";

const refuse = (code: string, detail: string) => new ServerRefused(detail, code);

type Key = Awaited<ReturnType<typeof importJWK>>;

export class PermitVerifier {
  private readonly keys = new Map<string, Promise<Key>>();

  constructor(
    jwks: { keys?: JWK[] },
    readonly options: { issuer?: string; audience?: string } = {},
  ) {
    for (const k of jwks.keys ?? []) {
      if (k.kty === "OKP" && k.crv === "Ed25519" && typeof k.kid === "string") this.keys.set(k.kid, importJWK(k, ALGORITHM));
    }
  }

  /** Fetch the JWKS of a Cosigner server and build a verifier. */
  static async fromServer(url: string, options: { issuer?: string; audience?: string } = {}): Promise<PermitVerifier> {
    const resp = await fetch(url.replace(/\/+$/, "") + "/.well-known/jwks.json");
    if (!resp.ok) throw new Error(`JWKS fetch failed: HTTP ${resp.status}`);
    return new PermitVerifier((await resp.json()) as { keys?: JWK[] }, options);
  }

  /**
   * The permit's claims when it is valid for exactly `tool(args)`. Throws
   * {@link ServerRefused}: `malformed_permit`, `bad_signature`, `unknown_kid`, `expired`,
   * `not_yet_valid`, `wrong_audience`, `tenant_mismatch`, `tool_mismatch`,
   * `args_mismatch` (the server's codes).
   */
  async verify(token: string, expect: { tool: string; args: Record<string, unknown>; tenant?: string; now?: number }): Promise<Record<string, any>> {
    if (typeof token !== "string" || token.split(".").length !== 3) throw refuse("malformed_permit", "not a compact JWS");
    let header: ReturnType<typeof decodeProtectedHeader>;
    try {
      header = decodeProtectedHeader(token);
    } catch {
      throw refuse("malformed_permit", "permit header is not base64url JSON");
    }
    if (header.alg !== ALGORITHM || header.typ !== PERMIT_TYP) throw refuse("bad_signature", "algorithm or token type not accepted");
    const key = this.keys.get(String(header.kid));
    if (!key) throw refuse("unknown_kid", "signing key is not in the JWKS");
    let payload: Uint8Array;
    try {
      ({ payload } = await compactVerify(token, await key, { algorithms: [ALGORITHM] }));
    } catch {
      throw refuse("bad_signature", "signature verification failed");
    }
    let claims: Record<string, any>;
    try {
      claims = JSON.parse(new TextDecoder().decode(payload));
    } catch {
      throw refuse("malformed_permit", "permit payload is not JSON");
    }
    if (!claims || typeof claims !== "object") throw refuse("malformed_permit", "permit payload is not a JSON object");
    const current = Math.floor(expect.now ?? Date.now() / 1000);
    if (!Number.isInteger(claims.exp) || !Number.isInteger(claims.nbf)) throw refuse("malformed_permit", "exp/nbf missing or not integers");
    if (claims.iss !== (this.options.issuer ?? "cosigner")) throw refuse("bad_signature", "permit was not issued by this server");
    if (claims.aud !== (this.options.audience ?? "cosigner-executor")) throw refuse("wrong_audience", "permit is meant for another audience");
    if (current >= claims.exp) throw refuse("expired", "permit has expired");
    if (current < claims.nbf) throw refuse("not_yet_valid", "permit is not valid yet");
    if (expect.tenant !== undefined && claims.tenant !== expect.tenant) throw refuse("tenant_mismatch", "permit belongs to another tenant");
    if (claims.tool !== expect.tool) throw refuse("tool_mismatch", "permit is for another tool");
    const bound = Buffer.from(String(claims.args_hash ?? ""));
    const mine = Buffer.from(argsHash(expect.args));
    if (bound.length !== mine.length || !timingSafeEqual(bound, mine)) throw refuse("args_mismatch", "arguments differ from the approved ones");
    return claims;
  }
}

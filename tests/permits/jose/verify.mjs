// Verify a Cosigner permit offline with Node's `jose`, as a Node executor would.
// stdin: {"jwks": {...}, "token": "...", "alg": "Ed25519" | "EdDSA"}
// stdout: {"ok": true, "claims": {...}} or {"ok": false, "error": "<jose error code>"}
import { createLocalJWKSet, jwtVerify } from "jose";

let input = "";
for await (const chunk of process.stdin) input += chunk;
const { jwks, token, alg } = JSON.parse(input);
try {
  const { payload, protectedHeader } = await jwtVerify(token, createLocalJWKSet(jwks), {
    algorithms: [alg],
    issuer: "cosigner",
    audience: "cosigner-executor",
    typ: "cosigner-permit+jwt",
  });
  console.log(JSON.stringify({ ok: true, alg: protectedHeader.alg, claims: payload }));
} catch (error) {
  console.log(JSON.stringify({ ok: false, error: error.code || String(error) }));
}

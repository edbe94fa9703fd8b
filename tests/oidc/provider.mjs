// A real OpenID provider for Cosigner's single sign-on tests: the certified npm
// `oidc-provider`, unmodified, with a test login page and one optional tampering step.
//
// Environment:
//   PORT            loopback port to listen on (the issuer is http://127.0.0.1:PORT)
//   STATE_FILE      JSON file the tests write, read on every request:
//                   {"accounts": {"<sub>": {"groups": [...], "otp": "123456",
//                                           "tamper": null | "aud" | "expired" |
//                                                     "signature" | "replay"}}}
//   CLIENTS         JSON list of {client_id, client_secret, redirect_uris}
//
// Login (GET/POST /interaction/:uid): the form takes an account name (its `sub`) and an
// optional one-time code. Without the code the session's acr is urn:cosigner:test:pwd and
// amr ["pwd"]; with the account's code, urn:cosigner:test:mfa and ["pwd", "otp"]. The
// provider itself puts auth_time, nonce, iss, aud, exp and the signature in the ID token.
//
// Tampering (the cases a real provider never produces): after the provider's own token
// endpoint answered, an account's `tamper` rewrites the ID token: "aud" and "expired"
// re-sign it with the provider's own key (so only that claim is wrong), "signature" signs it
// with another key under the same kid, "replay" sends the account's previous ID token (an
// old nonce, still validly signed) instead.

import { readFileSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import Provider from 'oidc-provider';
import { SignJWT, decodeJwt, exportJWK, generateKeyPair, importJWK } from 'jose';

const port = Number(process.env.PORT);
const issuer = `http://127.0.0.1:${port}`;
const clients = JSON.parse(process.env.CLIENTS).map((c) => ({
  ...c, grant_types: ['authorization_code'], response_types: ['code'],
  token_endpoint_auth_method: 'client_secret_basic',
}));

function state() {
  return JSON.parse(readFileSync(process.env.STATE_FILE, 'utf8'));
}

function account(sub) {
  return state().accounts?.[sub];
}

const kid = `test-${randomUUID()}`;
const { privateKey } = await generateKeyPair('RS256', { extractable: true });
const signingJwk = { ...(await exportJWK(privateKey)), kid, alg: 'RS256', use: 'sig' };
const otherKey = (await generateKeyPair('RS256')).privateKey;
const providerKey = await importJWK(signingJwk, 'RS256');

const ACR_PWD = 'urn:cosigner:test:pwd';
const ACR_MFA = 'urn:cosigner:test:mfa';

const provider = new Provider(issuer, {
  clients,
  jwks: { keys: [signingJwk] },
  cookies: { keys: [randomUUID()] },
  acrValues: [ACR_PWD, ACR_MFA],
  // acr, amr and auth_time in every ID token (as most IdPs send them), not only when the
  // claims parameter asks.
  claims: {
    acr: null, amr: null, auth_time: null, sid: null, iss: null,
    openid: ['sub', 'acr', 'amr', 'auth_time'], profile: ['name'], groups: ['groups'],
  },
  scopes: ['openid', 'profile', 'groups'],
  conformIdTokenClaims: false, // scope claims (groups) in the ID token, as IdPs do
  features: { devInteractions: { enabled: false } },
  pkce: { required: () => true },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  async findAccount(ctx, sub) {
    const found = account(sub);
    if (!found) return undefined;
    return {
      accountId: sub,
      async claims() {
        return { sub, name: found.name ?? sub, groups: found.groups ?? [] };
      },
    };
  },
  async loadExistingGrant(ctx) {
    // First-party test client: consent is implied, every requested scope granted.
    const grantId = ctx.oidc.result?.consent?.grantId
      || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) {
      const found = await ctx.oidc.provider.Grant.find(grantId);
      if (found) return found;
    }
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope('openid profile groups');
    await grant.save();
    return grant;
  },
});

const lastIdToken = new Map();

provider.use(async (ctx, next) => {
  await next();
  if (ctx.path !== '/token' || ctx.status !== 200 || !ctx.body?.id_token) return;
  const original = ctx.body.id_token;
  const claims = decodeJwt(original);
  const mode = account(claims.sub)?.tamper;
  if (!mode) {
    lastIdToken.set(claims.sub, original);
    return;
  }
  const now = Math.floor(Date.now() / 1000);
  const header = { alg: 'RS256', kid, typ: 'JWT' };
  if (mode === 'aud') {
    ctx.body.id_token = await new SignJWT({ ...claims, aud: 'some-other-client' })
      .setProtectedHeader(header).sign(providerKey);
  } else if (mode === 'expired') {
    ctx.body.id_token = await new SignJWT({ ...claims, iat: now - 3600, exp: now - 1800 })
      .setProtectedHeader(header).sign(providerKey);
  } else if (mode === 'signature') {
    ctx.body.id_token = await new SignJWT(claims).setProtectedHeader(header).sign(otherKey);
  } else if (mode === 'replay' && lastIdToken.has(claims.sub)) {
    ctx.body.id_token = lastIdToken.get(claims.sub);
  }
});

function escape(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

async function formBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
}

provider.use(async (ctx, next) => {
  const match = ctx.path.match(/^\/interaction\/([^/]+)(\/login)?$/);
  if (!match) return next();
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  if (ctx.method === 'GET') {
    const requested = details.params.acr_values ?? '';
    ctx.type = 'html';
    ctx.body = `<!doctype html><html><head><title>Test IdP sign-in</title></head><body>
<h1>Test IdP</h1><p id="requested-acr">${escape(requested)}</p>
<p id="prompt">${escape(details.prompt.name)}</p>
<form method="post" action="/interaction/${escape(details.uid)}/login">
<label>Account <input name="login" id="idp-login"></label>
<label>One-time code <input name="otp" id="idp-otp"></label>
<button type="submit" id="idp-submit">Sign in</button></form></body></html>`;
    return undefined;
  }
  if (ctx.method === 'POST' && match[2]) {
    const form = await formBody(ctx.req);
    const sub = form.get('login') ?? '';
    const found = account(sub);
    if (!found) {
      ctx.status = 400;
      ctx.body = 'unknown test account';
      return undefined;
    }
    const mfa = Boolean(form.get('otp')) && form.get('otp') === found.otp;
    const login = { accountId: sub, acr: mfa ? ACR_MFA : ACR_PWD, amr: mfa ? ['pwd', 'otp'] : ['pwd'] };
    await provider.interactionFinished(ctx.req, ctx.res, { login }, { mergeWithLastSubmission: false });
    ctx.respond = false;
    return undefined;
  }
  return next();
});

provider.listen(port, '127.0.0.1', () => {
  process.stdout.write(`listening ${issuer}\n`);
});

// Shared by the live tests: the Cosigner the harness (tests/client_ts) started, and
// real loopback network faults (no mock of Cosigner).
import http from "node:http";
import net from "node:net";

export const env = {
  url: process.env.COSIGNER_URL,
  runtime: process.env.COSIGNER_RUNTIME_KEY,
  approver: process.env.COSIGNER_APPROVER_KEY,
  tenant: process.env.COSIGNER_TENANT,
};
/** Live tests are skipped only when run by hand without the harness's server. */
export const live = env.url ? {} : { skip: "COSIGNER_URL not set (run through pytest tests/client_ts)" };

export const ACTORS = { principal: { id: "customer-42", type: "customer" }, initiator: { id: "agent-ts", type: "agent" } };

export async function api(method, path, key, body) {
  const resp = await fetch(env.url + path, {
    method,
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await resp.text();
  return { status: resp.status, data: text ? JSON.parse(text) : null };
}

/** Approve (or reject) through the API, as a human approver would. */
export async function review(approvalId, decision = "approved") {
  const r = await api("POST", `/v1/approvals/${approvalId}/reviews`, env.approver, { decision, comment: "checked" });
  if (r.status >= 300) throw new Error(`review failed: ${r.status} ${JSON.stringify(r.data)}`);
  return r.data;
}

/** Wait until a pending approval for `tool` appears; returns it. */
export async function pendingFor(tool) {
  for (let i = 0; i < 200; i++) {
    const r = await api("GET", "/v1/approvals?status=pending", env.approver);
    const hit = (r.data.items ?? []).find((a) => JSON.stringify(a).includes(tool));
    if (hit) return hit;
    await new Promise((res) => setTimeout(res, 50));
  }
  throw new Error(`no pending approval for ${tool}`);
}

/**
 * An HTTP proxy to the live server. `plan["POST /v1/permits/redeem"] = ["lose"]`:
 * `lose` forwards, then closes the connection without answering (the server acted, the
 * client never hears); `503` answers 503 without forwarding; `pass` forwards.
 */
export async function faultProxy() {
  const plan = {};
  const seen = [];
  const server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks);
    seen.push({ method: req.method, path: req.url, body: body.toString() });
    let action = "pass";
    for (const [key, actions] of Object.entries(plan)) {
      const [m, prefix] = key.split(" ");
      if (m === req.method && req.url.startsWith(prefix) && actions.length) {
        action = actions.shift();
        break;
      }
    }
    if (action === "503") {
      res.writeHead(503, { "Content-Type": "application/json" }).end('{"code":"overloaded","detail":"injected"}');
      return;
    }
    const headers = { ...req.headers };
    delete headers.host;
    delete headers["content-length"];
    const up = await fetch(env.url + req.url, { method: req.method, headers, body: body.length ? body : undefined });
    const text = Buffer.from(await up.arrayBuffer());
    if (action === "lose") {
      req.socket.destroy();
      return;
    }
    res.writeHead(up.status, { "Content-Type": up.headers.get("content-type") ?? "application/json" }).end(text);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    plan,
    seen,
    close: () => new Promise((r) => { server.closeAllConnections?.(); server.close(r); }),
  };
}

/** A socket that accepts connections and never answers. */
export async function stalledSocket() {
  const sockets = [];
  const server = net.createServer((s) => sockets.push(s));
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    close: () => new Promise((r) => { sockets.forEach((s) => s.destroy()); server.close(r); }),
  };
}

/** A port nothing listens on. */
export async function closedPort() {
  const server = net.createServer();
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const port = server.address().port;
  await new Promise((r) => server.close(r));
  return `http://127.0.0.1:${port}`;
}

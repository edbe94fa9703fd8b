#!/usr/bin/env bash
# System packages the test suite drives for real: Debian's Chromium (Playwright uses
# /usr/bin/chromium; browser downloads are impossible here) and Node.js/npm for the
# third-party MCP server. Installed only when missing.
set -euo pipefail
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v npm >/dev/null || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} (Debian packages)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The npm MCP server the gate tests wrap, pinned by tests/mcp/package-lock.json
# (tests/mcp/conftest.py runs the same `npm ci` when this script was skipped).
if [ ! -f "$(dirname "$0")/../tests/mcp/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js" ]; then
  (cd "$(dirname "$0")/../tests/mcp" && npm ci --no-audit --no-fund --loglevel=error)
fi
# openapi-typescript, run on openapi.yaml by tests/http/test_openapi_clients.py, pinned by
# tests/http/openapi_ts/package-lock.json.
if [ ! -f "$(dirname "$0")/../tests/http/openapi_ts/node_modules/openapi-typescript/bin/cli.js" ]; then
  (cd "$(dirname "$0")/../tests/http/openapi_ts" && npm ci --no-audit --no-fund --loglevel=error)
fi
# The TypeScript client's dependencies, pinned by clients/typescript/package-lock.json
# (tests/client_ts runs the same `npm ci` when this script was skipped).
if [ ! -f "$(dirname "$0")/../clients/typescript/node_modules/.package-lock.json" ]; then
  (cd "$(dirname "$0")/../clients/typescript" && npm ci --no-audit --no-fund --loglevel=error)
fi
# Node's jose, which tests/permits verifies permits with offline (pinned by its lock file;
# tests/permits/test_offline_verifiers.py runs the same `npm ci` when this was skipped).
if [ ! -d "$(dirname "$0")/../tests/permits/jose/node_modules/jose" ]; then
  (cd "$(dirname "$0")/../tests/permits/jose" && npm ci --no-audit --no-fund --loglevel=error)
fi
# axe-core, injected into the approver pages by tests/web/test_browser_pages.py (pinned by
# tests/web/axe/package-lock.json; the test runs the same `npm ci` when this was skipped).
if [ ! -f "$(dirname "$0")/../tests/web/axe/node_modules/axe-core/axe.min.js" ]; then
  (cd "$(dirname "$0")/../tests/web/axe" && npm ci --no-audit --no-fund --loglevel=error)
fi
# The OpenID provider the single sign-on tests start (npm oidc-provider, pinned by
# tests/oidc/package-lock.json; tests/oidc/conftest.py runs the same `npm ci` when this
# was skipped).
if [ ! -f "$(dirname "$0")/../tests/oidc/node_modules/oidc-provider/package.json" ]; then
  (cd "$(dirname "$0")/../tests/oidc" && npm ci --no-audit --no-fund --loglevel=error)
fi

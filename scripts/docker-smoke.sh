#!/usr/bin/env bash
# Build the image and start it, then the compose pair, on a machine with Docker (none runs
# on the development machines): README § Docker. Exits non-zero on the first failure.
#   scripts/docker-smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."
image=cosigner:smoke
docker build -t "$image" .

# 1. One container, SQLite in a volume: healthy, ready (reference bundles loaded), a decision.
name=cosigner-smoke-$$
docker run -d --name "$name" -p 127.0.0.1:18080:8080 "$image" >/dev/null
trap 'docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
for _ in $(seq 60); do
  [ "$(docker inspect -f '{{.State.Health.Status}}' "$name")" = healthy ] && break
  sleep 2
done
[ "$(docker inspect -f '{{.State.Health.Status}}' "$name")" = healthy ]
[ "$(docker exec "$name" id -u)" = 10001 ]
curl -fsS http://127.0.0.1:18080/readyz
key=$(docker exec "$name" cosigner principals add-key --tenant smoke --role runtime)
curl -fsS http://127.0.0.1:18080/v1/decisions -H "Authorization: Bearer $key" \
  -H 'Content-Type: application/json' \
  -d '{"request_id": "smoke-1", "run": {"id": "r"}, "principal": {"id": "p"},
       "initiator": {"id": "i"}, "tool": {"name": "get_order"},
       "args": {"order_id": "ord_1"}}' | grep -q '"effect":"allow"'
echo "image: healthy, non-root, ready, allow decision OK"

# 2. PostgreSQL and two replicas sharing the KEK: both ready, one keyring.
export COSIGNER_KEY_ENCRYPTION_KEY=${COSIGNER_KEY_ENCRYPTION_KEY:-$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')}
docker compose up -d --build
trap 'docker compose down -v >/dev/null 2>&1 || true; docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
for port in 8081 8082; do
  for _ in $(seq 60); do curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 2; done
  curl -fsS "http://127.0.0.1:$port/readyz"
done
[ "$(curl -fsS http://127.0.0.1:8081/.well-known/jwks.json)" = "$(curl -fsS http://127.0.0.1:8082/.well-known/jwks.json)" ]
echo "compose: both replicas ready with the same JWKS"

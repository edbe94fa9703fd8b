# Cosigner: non-root; applies migrations, then serves.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    COSIGNER_DATABASE_URL=sqlite+aiosqlite:////data/cosigner.db \
    COSIGNER_KEY_DIR=/data/keys \
    COSIGNER_BUNDLE_DIRS='["/app/policies", "/app/rego"]'
WORKDIR /app
COPY pyproject.toml README.md ./
COPY cosigner ./cosigner
RUN pip install --no-cache-dir . && useradd --system --uid 10001 --home /data cosigner \
    && mkdir -p /data && chown cosigner /data
COPY policies ./policies
COPY rego ./rego
USER cosigner
VOLUME ["/data"]
EXPOSE 8080
# `serve` runs the Alembic migrations before it starts listening.
CMD ["cosigner", "serve", "--host", "0.0.0.0", "--port", "8080"]

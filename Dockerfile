# syntax=docker/dockerfile:1
# Cosigner server image: built in one stage, run in a slim one as a non-root user.
#   docker build -t cosigner .
#   docker run -p 8080:8080 -v cosigner-data:/data cosigner
# Python dependencies are pinned by requirements.lock (`make lock`), the same file `make`
# installs the test environment with, so the image runs what the tests ran.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements.lock pyproject.toml README.md ./
COPY cosigner ./cosigner
# Only the server's own dependency closure is installed, each at the lock's version (the
# lock also pins the test tools, which a constraints file does not install).
RUN --mount=type=cache,target=/root/.cache/pip \
    python -m venv /opt/cosigner \
    && /opt/cosigner/bin/pip install -c requirements.lock . \
    && /opt/cosigner/bin/pip check

FROM ${PYTHON_IMAGE} AS runtime
# libatomic1: regopy's native library (rego-cpp) links against libatomic.so.1, which the
# slim image lacks; without it the server cannot load a Rego bundle.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libatomic1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /data --shell /usr/sbin/nologin cosigner \
    && mkdir -p /data /etc/cosigner/bundles \
    && chown cosigner:cosigner /data
COPY --from=build /opt/cosigner /opt/cosigner
# The reference bundles (README § Docker): Python rules and Rego, with their golden cases.
COPY policies /usr/share/cosigner/bundles/policies
COPY rego /usr/share/cosigner/bundles/rego
ENV PATH=/opt/cosigner/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    COSIGNER_DATABASE_URL=sqlite+aiosqlite:////data/cosigner.db \
    COSIGNER_KEY_DIR=/data/keys \
    COSIGNER_BUNDLE_DIRS='["/usr/share/cosigner/bundles/policies", "/usr/share/cosigner/bundles/rego"]'
USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
# `serve` applies the migrations (under a lock, so replicas may start together) first.
CMD ["cosigner", "serve", "--host", "0.0.0.0", "--port", "8080"]

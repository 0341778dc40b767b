# stackflow worker image (used by the stackflow-worker and codec-server services in
# docker-compose.yml).
#
#   docker build -t stackflow-worker:0.1.0 .
#
# The image carries Python, the locked dependencies and the stackflow sources.
# It ships no terraform/tofu binary: extend it (FROM stackflow-worker) and set
# STACKFLOW_TF_BIN if your stacks use the terraform runtime.
FROM python:3.11.13-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    UV_PROJECT_ENVIRONMENT=/app/.venv \
    UV_PYTHON=/usr/local/bin/python3.11 \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1

# uv is pinned to the version that wrote uv.lock.
RUN pip install --no-cache-dir "uv==0.13.8"

WORKDIR /app

# Dependencies first, so editing the sources does not re-install them.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --no-install-project

COPY stackflow/ stackflow/
RUN uv sync --frozen --no-dev

# Unprivileged runtime user with a fixed uid/gid (10001), for the worker and
# the codec server. /data/stackflow (caches, working dirs) and /data/onprem (the
# OnPrem root) are created here, owned by it and 0700, so a fresh named volume
# mounted over either inherits that ownership and stays writable. The sources
# under /app stay root-owned: the worker cannot change its own code.
RUN groupadd --system --gid 10001 stackflow \
    && useradd --system --uid 10001 --gid stackflow --create-home \
        --home-dir /home/stackflow --shell /usr/sbin/nologin stackflow \
    && mkdir -p /data/stackflow /data/onprem \
    && chown stackflow:stackflow /data/stackflow /data/onprem \
    && chmod 0700 /data/stackflow /data/onprem

ENV PATH="/app/.venv/bin:${PATH}" \
    STACKFLOW_HOME=/data/stackflow

USER stackflow:stackflow
VOLUME ["/data/stackflow", "/data/onprem"]

# The worker (stackflow.worker.main) is expected to shut down gracefully on SIGTERM; compose allows it 60s.
STOPSIGNAL SIGTERM
CMD ["/app/.venv/bin/python", "-m", "stackflow.worker"]

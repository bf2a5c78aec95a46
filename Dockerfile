# syntax=docker/dockerfile:1
# The sessionstate service: Flask served by hypercorn in one process (LevelDB
# admits one process), its data on a volume, running as an unprivileged user.
# docs/deployment.md explains how to build and run it; docker-compose.yml runs it
# with the official OPA image as a sidecar in its network namespace.

# Wheels of the project and its dependencies, fetched and built apart so that no source
# tree, compiler cache or pip cache reaches the image. The dependencies are exactly the
# lock's (requirements/runtime.txt, exported from uv.lock): pinned, hash-checked, binary
# wheels only; the project's wheel carries the default policies (setup.py).
FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements/runtime.txt requirements/
RUN pip download --require-hashes --only-binary=:all: --dest /wheels -r requirements/runtime.txt
COPY pyproject.toml setup.py MANIFEST.in LICENSE README.md ./
COPY store/ store/
COPY service/ service/
COPY policies/ policies/
RUN pip wheel --no-deps --wheel-dir /wheels/project .

# The pinned OPA (scripts/tools.sh's OPA_VERSION), statically linked. Only used when
# the image runs alone (no SESSIONSTATE_OPA_URL): the service then starts and locks
# down its own OPA sidecar inside the container, as `make run` does.
FROM openpolicyagent/opa:1.22.3-static AS opa

FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A fixed numeric uid/gid, so that volume ownership is predictable and runAsNonRoot
# checks can verify it. The data dir is created here, owned by that user with mode
# 0700, so that a fresh named volume mounted on it starts out the same.
RUN groupadd --system --gid 10001 sessionstate \
 && useradd --system --uid 10001 --gid sessionstate --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin sessionstate \
 && install -d -m 0700 -o sessionstate -g sessionstate /var/lib/sessionstate

# A regular, non-editable install from no index: the locked dependencies (their hashes
# checked again), then the project's wheel alone.
RUN --mount=type=bind,from=build,source=/wheels,target=/tmp/wheels \
    --mount=type=bind,from=build,source=/src/requirements,target=/tmp/requirements \
    pip install --no-index --find-links /tmp/wheels --require-hashes -r /tmp/requirements/runtime.txt \
 && pip install --no-index --no-deps /tmp/wheels/project/*.whl

COPY --from=opa /opa /usr/local/bin/opa
# The policies, for the in-container sidecar only; with SESSIONSTATE_OPA_URL set
# (as in docker-compose.yml) the service does not read them. The wheel carries the same
# set (service/default_policies); SESSIONSTATE_POLICY_DIR names this copy.
COPY policies/ /opt/sessionstate/policies/

ENV SESSIONSTATE_HOST=0.0.0.0 \
    SESSIONSTATE_PORT=8080 \
    SESSIONSTATE_DATA_DIR=/var/lib/sessionstate \
    SESSIONSTATE_POLICY_DIR=/opt/sessionstate/policies \
    SESSIONSTATE_OPA_BIN=/usr/local/bin/opa

VOLUME ["/var/lib/sessionstate"]
USER 10001:10001
EXPOSE 8080

# Ready, not merely alive: OPA answers with a policy revision and the store is open.
# The slim image has no curl; Python's urllib raises on any non-2xx answer.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('SESSIONSTATE_PORT', '8080'), timeout=4)"]

# `sessionstate serve`: one process, hypercorn reading requests, 16 threads running them.
CMD ["sessionstate", "serve"]

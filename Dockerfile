# The autoscalerd sidecar image: `docker build -t autoscalerd .`
#
# Run: the config mounted read-only at /etc/autoscalerd/config.yaml, state on a volume:
#   docker run -v $PWD/config/ray.yaml:/etc/autoscalerd/config.yaml:ro \
#              -v autoscalerd-state:/var/lib/autoscalerd -p 8270:8270 autoscalerd
# The POST /v1/... endpoints stay off unless AUTOSCALERD_TOKEN (or http.token) is set.
# The image holds the daemon's dependencies only (requirements.lock: none of the
# backtest's and the demo's matplotlib, rich or Ray). The ray_autoscaler actuator needs
# Ray's SDK: build with --build-arg LOCK=requirements-ray.lock.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG LOCK=requirements.lock
WORKDIR /src
# Dependencies first, each at the lock's version and hash, so code changes reuse this layer.
COPY ${LOCK} ./requirements.lock
RUN python -m venv /opt/autoscalerd \
    && /opt/autoscalerd/bin/pip install --no-cache-dir --disable-pip-version-check \
        --require-hashes --requirement requirements.lock
COPY pyproject.toml README.md ./
COPY autoscalerd ./autoscalerd
COPY plugins ./plugins
RUN /opt/autoscalerd/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps .

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 autoscalerd \
    && useradd --system --uid 10001 --gid autoscalerd --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin autoscalerd \
    && mkdir -p /etc/autoscalerd /var/lib/autoscalerd \
    && chown autoscalerd:autoscalerd /var/lib/autoscalerd \
    && chmod 0700 /var/lib/autoscalerd
COPY --from=build /opt/autoscalerd /opt/autoscalerd
ENV PATH=/opt/autoscalerd/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    STATE_DIRECTORY=/var/lib/autoscalerd
VOLUME ["/var/lib/autoscalerd"]
USER 10001:10001
EXPOSE 8270
# /healthz: 200 while ticks complete. The image's python, no curl needed.
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8270/healthz', timeout=2)"]
ENTRYPOINT ["autoscalerd", "run"]
# In a pod, /metrics must be reachable from Prometheus: listen on every interface.
CMD ["--config", "/etc/autoscalerd/config.yaml", "--http-addr", "0.0.0.0:8270", "--log-format", "json"]

# syntax=docker/dockerfile:1
# chunlian: the service (`chunlian serve`, the default) and the bulk-job worker (`chunlian worker`)
# in one image. Built by scripts/build-image.sh, which first makes the base image from Debian
# packages (mmdebstrap + podman import: no image registry is needed) and puts the CPU build of
# torch (the pin in pyproject.toml) into .whl/ in the build context.
#
#   scripts/build-image.sh chunlian:latest
#   podman run --rm -p 8000:8000 chunlian:latest                      # the service on :8000
#   podman run --rm -e CHUNLIAN_BROKER_URL=redis://HOST:6379/0 chunlian:latest worker
ARG BASE=localhost/chunlian-base:bookworm

# ---- build: a virtual environment with torch (CPU), the dependencies and chunlian ---------------
FROM ${BASE} AS build
ARG TORCH_WHEEL
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_DEFAULT_TIMEOUT=120
RUN python3 -m venv /opt/chunlian
# torch first, from the wheel file alone: its own layer, reused until the pin changes; the
# constraint keeps every later step on this CPU build (PyPI's default torch is a CUDA build)
COPY .whl/${TORCH_WHEEL} /wheels/
RUN --mount=type=secret,id=pip_ca,target=/run/secrets/pip_ca \
    echo "torch==$(echo "${TORCH_WHEEL}" | cut -d- -f2)" > /wheels/constraints.txt \
    && PIP_CERT=/run/secrets/pip_ca /opt/chunlian/bin/pip install --find-links /wheels \
       --constraint /wheels/constraints.txt "/wheels/${TORCH_WHEEL}"
# the serving set: [project] dependencies from pyproject.toml, no extras (eval, plot, dev);
# reused until it changes
COPY pyproject.toml /src/
RUN --mount=type=secret,id=pip_ca,target=/run/secrets/pip_ca \
    /opt/chunlian/bin/python -c 'import tomllib; print("\n".join(tomllib.load(open("/src/pyproject.toml", "rb"))["project"]["dependencies"]))' > /wheels/requirements.txt \
    && PIP_CERT=/run/secrets/pip_ca /opt/chunlian/bin/pip install --find-links /wheels \
       --constraint /wheels/constraints.txt --requirement /wheels/requirements.txt
# chunlian itself, with the shipped weights (package data)
COPY README.md LICENSE /src/
COPY src /src/src
RUN --mount=type=secret,id=pip_ca,target=/run/secrets/pip_ca \
    PIP_CERT=/run/secrets/pip_ca /opt/chunlian/bin/pip install --no-deps /src \
    && /opt/chunlian/bin/python -c "from chunlian.model.checkpoint import DEFAULT_WEIGHTS; assert DEFAULT_WEIGHTS.is_file(), DEFAULT_WEIGHTS"
# what serving never loads: torch's C++ headers, its C++ test binaries, and its tools other
# than torch_shm_manager (which multiprocessing's shared tensors need): about 190 MB
RUN torch_dir=$(/opt/chunlian/bin/python -c 'import os, torch; print(os.path.dirname(torch.__file__))') \
    && rm -rf "$torch_dir/include" "$torch_dir/test" \
    && find "$torch_dir/bin" -type f ! -name torch_shm_manager -delete \
    && /opt/chunlian/bin/python -c "import torch; torch.ones(2) @ torch.ones(2)"

# ---- runtime: the base, the environment and an unprivileged user ---------------------------------
FROM ${BASE}
LABEL org.opencontainers.image.title="chunlian" \
      org.opencontainers.image.description="Spring Festival couplets (春联) at New Year's Eve scale" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 10001 chunlian \
    && useradd --uid 10001 --gid 10001 --no-log-init --create-home --home-dir /home/chunlian \
       --shell /usr/sbin/nologin chunlian
COPY --from=build /opt/chunlian /opt/chunlian
ENV PATH=/opt/chunlian/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CHUNLIAN_HOST=0.0.0.0 \
    CHUNLIAN_PORT=8000 \
    CHUNLIAN_DEVICE=cpu
USER 10001:10001
WORKDIR /home/chunlian
EXPOSE 8000
# liveness of the process; readiness (/readyz) is for the orchestrator's routing
HEALTHCHECK --interval=15s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('CHUNLIAN_PORT', '8000'), timeout=2)"]
# SIGTERM drains (chunlian serve: readiness fails, in-flight requests finish, exit 0;
# chunlian worker: Celery's warm shutdown)
STOPSIGNAL SIGTERM
ENTRYPOINT ["chunlian"]
CMD ["serve"]

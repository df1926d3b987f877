# nmt on CPUs, or on GPUs with `docker run --gpus all`. BASE brings Python, CUDA, cuDNN and PyTorch (a torch
# version the test suite has run on); nmt and its other dependencies go in at the versions of
# constraints.txt, leaving torch alone.
#
#   docker build -t nmt .
#   docker build --network host --build-arg BASE=nmt-base:local -t nmt .   # a local base: scripts/docker_base.sh
#
# Any --user may run it, also with --read-only: nothing is written outside /data, /runs and /tmp (give it
# a tmpfs: --tmpfs /tmp), where HOME and the caches point. `nmt serve` listens on every interface of the
# container (NMT_SERVE_HOST), so that `-p 8000:8000` reaches it.
ARG BASE=pytorch/pytorch:2.11.0-cuda13.0-cudnn9-runtime
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    MPLCONFIGDIR=/tmp/.matplotlib \
    NMT_SERVE_HOST=0.0.0.0

WORKDIR /opt/nmt
COPY constraints.txt pyproject.toml README.md ./
COPY nmt ./nmt
COPY configs ./configs
COPY scripts ./scripts
# nmt from its own metadata: pyproject.toml's dependencies and the serve and plot extras, at the versions
# of constraints.txt. Torch is constrained to the base's own version, so pip keeps it (or stops with a
# conflict when the base's torch is older than nmt needs) and never fetches a second one.
RUN python -c "from importlib.metadata import version; print('torch==' + version('torch'))" > /tmp/torch.txt \
    && pip install -c constraints.txt -c /tmp/torch.txt ".[serve,plot]" \
    && rm -rf /tmp/torch.txt build nmt.egg-info \
    && python -c "import torch, nmt, safetensors, fastapi, python_multipart, matplotlib; print('nmt', nmt.__version__, 'torch', torch.__version__)"

RUN mkdir -p /data /runs && chmod 1777 /data /runs
USER 1000:1000
VOLUME ["/data", "/runs"]
WORKDIR /runs
EXPOSE 8000
ENTRYPOINT ["nmt"]
CMD ["--help"]

# nmt on a GPU box. The base image brings CUDA, cuDNN and PyTorch; the package is installed
# without its torch requirement, so the image never downloads a second torch.
#
#   docker build -t nmt .
#   docker run --gpus all -v $PWD/data:/data -v $PWD/runs:/runs nmt train --config /data/C.yaml
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /opt/nmt
COPY pyproject.toml README.md ./
COPY nmt ./nmt
COPY configs ./configs
COPY scripts ./scripts
# Dependencies other than torch (already in the base image), the serve extra (nmt serve), then the
# package itself with --no-deps.
RUN pip install "sentencepiece>=0.2.0" "sacrebleu>=2.3" "typer>=0.9" "pyyaml>=6.0" "tqdm>=4.60" "numpy>=1.22" \
        "fastapi>=0.110" "uvicorn>=0.29" \
    && pip install --no-deps . \
    && python -c "import torch, nmt; print('nmt', nmt.__version__, 'torch', torch.__version__)"

RUN useradd --create-home --uid 1000 nmt && mkdir -p /data /runs && chown nmt:nmt /data /runs
USER nmt
VOLUME ["/data", "/runs"]
WORKDIR /runs
ENTRYPOINT ["nmt"]
CMD ["--help"]

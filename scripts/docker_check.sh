#!/usr/bin/env bash
# Build the image on BASE and run the whole pipeline in it as a user would, one line per step:
#
#   bash scripts/docker_check.sh BASE          # e.g. nmt-base:local (scripts/docker_base.sh) or a CUDA image
#
# It needs a running Docker engine and says so at once. The image gets a tag of this run only (removed at
# the end, with the run's containers), so no step ever runs an older image; a failed build stops the
# check there. Every container runs as the caller's uid:gid with a read-only root file system (a tmpfs on
# /tmp), host folders mounted on /data and /runs, and no network, except the server, which publishes its
# port on the host's loopback: build -> torch of the base -> preprocess -> train (20 updates) -> translate
# -> evaluate -> export -> serve, answered from the host, then `docker stop` -> `docker stop` during
# training (exit 143, last.pt written) -> resume. Data: the first 2,000 pairs of Multi30k (data/multi30k,
# ../shared/data/multi30k or the sample in tests/data/multi30k) with configs/smoke.yaml's model. GPUS=all
# adds `--gpus all`; AS_USER=uid:gid runs the containers as another user (run as root: the work folder is
# given to that user). Exits 1 if a step failed; each step's log stays in the printed work folder.
set -euo pipefail
# shellcheck source=scripts/script_usage.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/script_usage.sh"   # beside this file, links followed
[[ $# -eq 1 && "$1" != -* ]] || usage_error "takes BASE, got '$*'"
command -v docker > /dev/null || usage_error "needs docker (the Docker CLI), which is not on PATH"
engine="$(timeout 60 docker info --format '{{.ServerVersion}}' 2>&1)" \
  || usage_error "needs a running Docker engine (docker info: ${engine##*$'\n'})"      # its last line
cd "$(dirname "$0")/.."
base="$1"
corpus=""
for folder in data/multi30k ../shared/data/multi30k tests/data/multi30k; do
  [[ -z "$corpus" && -f "$folder/train.de.gz" ]] && corpus="$folder"
done
[[ -n "$corpus" ]] || usage_error "finds no Multi30k (data/multi30k, ../shared/data/multi30k, tests/data/multi30k)"

work="$(mktemp -d)"
image="nmt-check:$(basename "$work")"       # this run's own tag
cleanup() {                                 # this run's containers, then its tag (the layers stay as cache)
  docker ps -aq --filter "ancestor=$image" | xargs -r docker rm -f > /dev/null 2>&1 || true
  docker rmi --no-prune "$image" > /dev/null 2>&1 || true
}
trap cleanup EXIT
mkdir -p "$work/data" "$work/runs"
owner="${AS_USER:-$(id -u):$(id -g)}"
python3 - "$corpus" "$work/data" <<'PY'
import gzip, sys
from pathlib import Path
corpus, out = Path(sys.argv[1]), Path(sys.argv[2])
for split, n in (("train", 2000), ("val", 100), ("test_2016_flickr", 100)):
    for lang in ("de", "en"):
        with gzip.open(corpus / f"{split}.{lang}.gz", "rt", encoding="utf-8") as handle:
            lines = [next(handle) for _ in range(n)]
        (out / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
config = Path("configs/smoke.yaml").read_text(encoding="utf-8")
for key, value in (("train", "/data/train"), ("dev", "/data/val"), ("out_dir", "/runs/data"),
                   ("run_dir", "/runs/run")):
    config = "\n".join(f"  {key}: {value}" if line.strip().startswith(f"{key}:") else line
                       for line in config.splitlines()) + "\n"
(out / "C.yaml").write_text(config.replace("device: cpu", "device: auto"), encoding="utf-8")
PY
[[ "$owner" == "$(id -u):$(id -g)" ]] || chown -R "$owner" "$work"

failed=0
step() {                                    # step NAME COMMAND...: run it, log it, print one line
  local name="$1" start=$SECONDS status=0
  shift
  "$@" > "$work/$name.log" 2>&1 || status=$?
  if (( status == 0 )); then
    echo "ok      $name ($((SECONDS - start)) s)"
  else
    echo "FAILED  $name (exit $status, $((SECONDS - start)) s; log: $work/$name.log)"
    failed=1
  fi
}
gpus=()
[[ -n "${GPUS:-}" ]] && gpus=(--gpus "$GPUS")
user=(--user "$owner" --read-only --tmpfs /tmp "${gpus[@]}" -v "$work/data:/data:ro" -v "$work/runs:/runs")
run=(docker run --rm --network none "${user[@]}")

step build docker build --network host --build-arg "BASE=$base" -t "$image" .
(( failed == 0 )) || exit 1
echo "        image size: $(docker image inspect --format '{{.Size}}' "$image" 2>/dev/null | awk '{printf "%.0f MB", $1 / 1e6}')"
torch_of() {                                # torch's version and file in IMAGE
  docker run --rm --network none --entrypoint python "$1" -c 'import torch; print(torch.__version__, torch.__file__)'
}
same_torch() {                              # pip kept the base's torch: no second one, no other version
  local of_base of_image
  of_base="$(torch_of "$base")" && of_image="$(torch_of "$image")" || return 1
  echo "base: $of_base"$'\n'"image: $of_image"
  [[ "$of_base" == "$of_image" ]]
}
step torch-of-the-base same_torch
step preprocess "${run[@]}" "$image" preprocess --config /data/C.yaml
step train "${run[@]}" "$image" train --config /data/C.yaml --set training.max_updates=20
translate() {
  "${run[@]}" -i "$image" translate --checkpoint /runs/run/best.pt < "$work/data/test_2016_flickr.de" \
    > "$work/runs/hyp.en" && [[ "$(wc -l < "$work/runs/hyp.en")" -eq 100 ]]
}
step translate translate
step evaluate "${run[@]}" "$image" evaluate --hyp /runs/hyp.en --ref /data/test_2016_flickr.en
step export "${run[@]}" "$image" export /runs/run/best.pt --output /runs/model.nmt
owned() {                                   # what the containers wrote (hyp.en is the host shell's)
  [[ -z "$(find "$work/runs" -mindepth 1 ! -name hyp.en ! -uid "${owner%%:*}" -print -quit)" ]]
}
step files-owned-by-the-user owned

serve() {                                   # published on the host's loopback; answered; drained by docker stop
  local port id answer
  port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  id="$(docker run -d "${user[@]}" -p "127.0.0.1:$port:8000" "$image" serve --model /runs/model.nmt)"
  for _ in $(seq 60); do
    curl -fsS "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
    sleep 1
  done
  answer="$(curl -fsS -X POST -H 'Content-Type: application/json' -d '["Ein Hund läuft durch das Gras."]' \
    "http://127.0.0.1:$port/translate")" || { docker logs "$id"; docker rm -f "$id" > /dev/null; return 1; }
  echo "answer: $answer"
  docker stop -t 15 "$id" > /dev/null
  echo "exit code after docker stop: $(docker inspect --format '{{.State.ExitCode}}' "$id")"
  docker logs "$id" 2>&1 | tail -5
  docker rm "$id" > /dev/null
  [[ "$answer" == *translations* ]]
}
step serve serve

stop_and_resume() {                         # docker stop mid-training: last.pt within 10 s, exit 143; resume
  local id start code
  id="$(docker run -d --network none "${user[@]}" "$image" train --config /data/C.yaml \
    --set training.run_dir=/runs/stopped --set training.max_updates=100000 --set training.validate_every=100000)"
  for _ in $(seq 120); do
    grep -q '"event": "train"' "$work/runs/stopped/metrics.jsonl" 2>/dev/null && break
    sleep 1
  done
  start=$SECONDS
  docker stop -t 10 "$id" > /dev/null
  code="$(docker inspect --format '{{.State.ExitCode}}' "$id")"
  echo "stopped in $((SECONDS - start)) s, exit code $code"
  docker logs "$id" 2>&1 | tr '\r' '\n' | tail -3
  docker rm "$id" > /dev/null
  [[ "$code" == 143 && -f "$work/runs/stopped/last.pt" ]] || return 1
  "${run[@]}" "$image" train --config /data/C.yaml --set training.run_dir=/runs/stopped --resume \
    --set training.max_updates=100000 --set training.max_epochs=1 --set training.validate_every=100000
}
step stop-and-resume stop_and_resume
echo "work folder: $work"
exit "$failed"

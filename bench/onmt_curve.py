#!/usr/bin/env python
"""OpenNMT-py's dev BLEU by minute of training, to plot beside a recipe run of ours on the same GPU.

Trains OpenNMT-py 3.5.1 on the reference model (compare_opennmt.py's config: same pieces, model,
Adam 1e-3, clip 1.0, 2000-token batches) with label smoothing 0.1 like our recipes, saving a
checkpoint every --save-every updates; then decodes dev (val) greedily with each checkpoint and
scores it with sacreBLEU, and decodes test_2016_flickr with beam 5 from the checkpoint best on dev.
A checkpoint's minute is OpenNMT's own elapsed-seconds report at that update (training only:
OpenNMT validates nothing here, while our curve's minutes include our validations).

    python -m bench.onmt_curve --onmt-venv ONMT --device cuda --steps 6000 --save-every 500 \\
        --json-out onmt-curve.json
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

import yaml

from bench.compare_opennmt import build_vocab, onmt_config, onmt_translate_cmd, write_pieces
from bench.harness import OUT, REPO, write_result

ELAPSED = re.compile(r"Step (\d+)/.*?;\s+(\d+) sec")


def elapsed_by_step(log: str) -> dict[int, int]:
    """OpenNMT's report lines `Step N/ M; ...; S sec` as {N: S}."""
    return {int(m.group(1)): int(m.group(2)) for m in ELAPSED.finditer(log)}


def translate(venv: Path, model: Path, source: Path, out: Path, beam: int, device: str) -> list[str]:
    proc = subprocess.run(onmt_translate_cmd(venv, model, source, out, beam, device, 1.0), capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"onmt_translate failed:\n{proc.stderr[-3000:]}")
    return out.read_text(encoding="utf-8").splitlines()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--onmt-venv", type=Path, required=True, help="OpenNMT-py 3.5.1 install (bin/onmt_*)")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "multi30k_de_en_bahdanau.yaml")
    parser.add_argument("--work", type=Path, default=OUT / "onmt_curve")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--save-every", type=int, default=500)
    parser.add_argument("--json-out", type=Path, required=True)
    args = parser.parse_args()

    from nmt.config import load_config
    from nmt.data.corpus import read_lines, resolve_text_file
    from nmt.data.folder import DataFolder
    from nmt.evaluate import bleu

    data = load_config(args.config).data
    src, tgt = data.src_lang, data.tgt_lang
    args.work.mkdir(parents=True, exist_ok=True)
    write_pieces(args.config, args.work)
    config_path = onmt_config(args.work, args.steps, src, tgt, args.device)
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    config.update(label_smoothing=0.1, save_checkpoint_steps=args.save_every, keep_checkpoint=-1, report_every=50)
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    venv = args.onmt_venv
    build_vocab(venv, args.work, config_path)
    proc = subprocess.run([str(venv / "bin" / "onmt_train"), "-config", str(config_path)],
                          capture_output=True, text=True)
    (args.work / "train.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    if proc.returncode != 0:
        raise SystemExit(f"onmt_train failed:\n{proc.stderr[-3000:]}")
    elapsed = elapsed_by_step(proc.stdout + proc.stderr)

    sp = DataFolder.open(data.out_dir).vocab("tgt").sp

    def detok(lines: list[str]) -> list[str]:
        return [sp.decode_pieces(line.split()) for line in lines]

    dev_refs = read_lines(resolve_text_file(data.dev, tgt, "data.dev"))
    test_refs = read_lines(resolve_text_file(data.test, tgt, "data.test"))
    curve = []
    for step in range(args.save_every, args.steps + 1, args.save_every):
        model = args.work / "run" / f"model_step_{step}.pt"
        hyps = detok(translate(venv, model, args.work / f"val.sp.{src}", args.work / "dev.hyp", 1, args.device))
        reported = max((s for s in elapsed if s <= step), default=None)
        curve.append({"step": step, "minutes": round(elapsed[reported] / 60, 3) if reported else None,
                      "bleu": bleu(hyps, dev_refs)})
        print(json.dumps(curve[-1]), flush=True)
    best = max(curve, key=lambda point: point["bleu"])
    model = args.work / "run" / f"model_step_{best['step']}.pt"
    hyps = detok(translate(venv, model, args.work / f"test.sp.{src}", args.work / "test.hyp", 5, args.device))
    result = {"system": "OpenNMT-py 3.5.1", "onmt_config": config,
              "dev_bleu_curve": curve, "best_dev_step": best["step"], "best_dev_bleu": best["bleu"],
              "test_bleu_beam5": bleu(hyps, test_refs)}
    print(f"best dev {best['bleu']:.2f} at step {best['step']} ({best['minutes']} min); "
          f"test_2016_flickr beam 5: {result['test_bleu_beam5']:.2f}")
    write_result(args.json_out, result)


if __name__ == "__main__":
    main()

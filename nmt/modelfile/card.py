"""The model card: what `nmt info` prints, the page of `nmt serve` shows and a Hugging Face README holds."""

from __future__ import annotations

from typing import Any

import torch

from nmt.modelfile.file import LoadedModel


def describe(loaded: LoadedModel) -> dict[str, Any]:
    """The model card as a dictionary: languages, vocabulary, architecture, parameters, data, scores.
    input_feeding is None (n/a) for Bahdanau: its decoder feeds c_i, never h~ (nmt.model.seq2seq)."""
    c, card, shortlist = loaded.config, loaded.card, loaded.shortlist
    return {
        "file": str(loaded.path),
        "kind": loaded.kind,
        "languages": loaded.languages,
        "vocabulary": {"joint_sentencepiece": c.data.joint_vocab, "sentencepiece_type": c.data.spm_model_type,
                       "sentencepiece_pieces": loaded.src_vocab.sp.get_piece_size(),
                       "src_size": len(loaded.src_vocab), "tgt_size": len(loaded.tgt_vocab)},
        "architecture": {k: getattr(c.model, k) for k in ("rnn_type", "attention", "embedding_dim", "encoder_hidden",
                                                          "encoder_layers", "bidirectional", "decoder_hidden",
                                                          "decoder_layers")}
                        | {"input_feeding": None if c.model.attention == "bahdanau" else c.model.input_feeding},
        "parameters": parameter_count(loaded),
        "nonfinite_weights": [name for name, t in loaded.weights.items() if not bool(torch.isfinite(t).all())],
        "dtype": loaded.dtype,
        "decoding": {k: getattr(c.decoding, k) for k in ("beam_size", "length_penalty", "max_len_ratio",
                                                         "max_input_len", "precision", "quantize")},
        "shortlist": None if shortlist is None else {
            "k": int(shortlist["targets"].shape[1]), "frequent": len(shortlist["frequent"]),
            "score": shortlist.get("score"), "pairs": shortlist.get("pairs"),
            "default_on_cpu": loaded.shortlist_on_cpu},
        **{key: card.get(key) for key in ("data", "data_files", "dev", "training")},
        **({"averaged_from": card["averaged_from"]} if "averaged_from" in card else {}),
    }


def parameter_count(loaded: LoadedModel) -> int:
    """The scalars of all weights: the card's `parameters`, and what config.json (nmt.modelfile.hf) can share."""
    return sum(t.numel() for t in loaded.weights.values())


def format_card(info: dict[str, Any]) -> str:
    """The model card as Markdown, for `nmt info`."""
    langs = info["languages"]
    vocab, arch = info["vocabulary"], info["architecture"]
    lines = [
        f"# nmt model: {langs['src']} -> {langs['tgt']}",
        "",
        f"- file: {info['file']} ({info['kind']}, weights {info['dtype']})",
        f"- languages: source {langs['src']}, target {langs['tgt']}",
        f"- vocabulary: {'joint' if vocab['joint_sentencepiece'] else 'separate'} SentencePiece "
        f"{vocab['sentencepiece_type']} model of {vocab['sentencepiece_pieces']} pieces; "
        f"source side {vocab['src_size']}, target side {vocab['tgt_size']}",
        f"- architecture: {'bi-' if arch['bidirectional'] else ''}{arch['rnn_type'].upper()} encoder "
        f"{arch['encoder_layers']}x{arch['encoder_hidden']}, "
        f"decoder {arch['decoder_layers']}x{arch['decoder_hidden']}, "
        f"{arch['attention']} attention, embeddings {arch['embedding_dim']}",
        f"- parameters: {info['parameters']:,}",
        *([f"- BROKEN: non-finite values (NaN or inf) in {', '.join(info['nonfinite_weights'])}"]
          if info.get("nonfinite_weights") else []),
        "- decoding defaults: " + ", ".join(f"{k} {v}" for k, v in info["decoding"].items()),
    ]
    shortlist = info.get("shortlist")
    if shortlist:
        lines.append(f"- vocabulary shortlist: {shortlist['k']} target pieces per source piece ({shortlist['score']}) "
                     f"+ the {shortlist['frequent']} most frequent, from {shortlist['pairs']} training pairs; "
                     + ("used by default when decoding on the CPU (--no-shortlist: the full vocabulary)"
                        if shortlist["default_on_cpu"] else "off by default: this model samples (--shortlist is "
                        "refused with sampling; --no-sampling --shortlist uses it)"))
    data, files = info.get("data") or {}, info.get("data_files") or {}
    names = {split: f" ({files[split]})" if split in files else "" for split in data}
    lines.append("- data: " + ("; ".join(f"{split}{names[split]} {entry.get('pairs', '?')} sentence pairs"
                                         for split, entry in data.items()) or "not recorded"))
    dev = info.get("dev")
    scored = f" on {dev['sentences']} sentences" if dev and dev.get("sentences") else ""
    lines.append(f"- dev BLEU: {dev['bleu']:.2f} ({dev.get('search', 'greedy')} search{scored}, at update "
                 f"{dev['step']}; sacreBLEU {dev['signature']})" if dev else "- dev BLEU: not recorded")
    training = info.get("training") or {}
    if training:
        seconds = f", {training['seconds'] / 60:.1f} minutes" if "seconds" in training else ""
        lines.append(f"- training: {training.get('step', '?')} updates{seconds}")
    if info.get("averaged_from"):
        lines.append(f"- averaged from: {', '.join(info['averaged_from'])}")
    return "\n".join(lines)


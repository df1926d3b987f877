"""The exported encoder and step as onnxruntime sessions, in the shape the numpy searches call them, and the
vocabulary shortlist with the rule of nmt.decode.shortlist: per batch, the union of its source pieces' target
lists, the most frequent target pieces, the specials 0-3 (first: they keep their numbers) and any prefix pieces.
The step then returns h̃ (rows, dec_hidden), scored against the kept rows W_s[keep] h̃ + b_s[keep] only and
normalised over them, as the PyTorch shortlist view does."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from nmt.data.special import EOS
from nmt.runtime.folder import Manifest, OnnxFolderError


@dataclass
class Tensors:
    """Named arrays that searches reorder and shrink along each one's batch axis (memory: axis 0)."""

    arrays: dict[str, np.ndarray]
    axes: dict[str, int]
    graph: str = "beam"                 # the step graph they belong to ("greedy" or "beam")

    def take(self, index: np.ndarray) -> Tensors:
        return Tensors({name: np.take(a, index, axis=self.axes[name]) for name, a in self.arrays.items()},
                       self.axes, self.graph)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(rows, n) float32 -> log-probabilities over n, computed as torch's log_softmax."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def session_options(threads: int) -> Any:
    """onnxruntime's options for `threads` CPU threads (0: onnxruntime's default)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3                      # warnings about unused initializers are not the user's
    return options


class OnnxModel:
    """The encoder and step sessions of an exported folder (one per distinct graph file)."""

    keep: np.ndarray | None = None      # with a shortlist: the scored target ids; tokens are positions in it
    weight_t: np.ndarray                # (dec_hidden, subset) W_s[keep]^T
    bias: np.ndarray                    # (subset,) b_s[keep]

    def __init__(self, manifest: Manifest, threads: int = 0) -> None:
        try:
            import onnxruntime as ort
        except ImportError:
            raise OnnxFolderError("an ONNX model folder needs onnxruntime: pip install onnxruntime") from None
        self.manifest = manifest
        options = session_options(threads)
        sessions: dict[str, Any] = {}
        for name in dict.fromkeys(name for graphs in manifest.graphs.values() for name in graphs.values()):
            path = manifest.graph(name)
            try:
                sessions[name] = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            except Exception as exc:       # onnxruntime's own exception classes
                raise OnnxFolderError(f"{manifest.folder / name}: onnxruntime cannot load it "
                                      f"({' '.join(str(exc).split())[:300]})") from None
        self.graph = {kind: {role: sessions[name] for role, name in graphs.items()}
                      for kind, graphs in manifest.graphs.items()}
        self.state_axes = dict(manifest.state)

    def encode(self, src: np.ndarray, src_lengths: np.ndarray, greedy: bool) -> tuple[Tensors, Tensors]:
        """src: (batch, src_len) int64 -> memory, initial state (one row per sentence)."""
        kind = "greedy" if greedy else "beam"
        outputs = self.graph[kind]["encoder"].run(None, {"src": src, "src_lengths": src_lengths})
        names = self.manifest.memory[kind]
        memory = Tensors(dict(zip(names, outputs[: len(names)], strict=True)), dict.fromkeys(names, 0), kind)
        state = Tensors(dict(zip(self.state_axes, outputs[len(names):], strict=True)), self.state_axes, kind)
        return memory, state

    def step(self, prev: np.ndarray, state: Tensors, memory: Tensors) -> tuple[np.ndarray, Tensors, np.ndarray]:
        """prev: (rows,) -> log p (rows, vocab or subset) float32, the new state, attention (rows, src_len)."""
        first, role = ("log_probs", "step") if self.keep is None else ("features", "step_features")
        names = [first, *(f"next_{name}" for name in self.state_axes), "attention"]
        inputs = {"prev_tokens": prev if self.keep is None else self.keep[prev], **state.arrays, **memory.arrays}
        outputs = self.graph[memory.graph][role].run(names, inputs)
        new_state = Tensors(dict(zip(self.state_axes, outputs[1:-1], strict=True)), self.state_axes, state.graph)
        if self.keep is not None:
            outputs[0] = log_softmax(outputs[0].astype(np.float32, copy=False) @ self.weight_t + self.bias)
        return outputs[0], new_state, outputs[-1].astype(np.float32, copy=False)

    def vocab_ids(self, tokens: np.ndarray) -> np.ndarray:
        return tokens if self.keep is None else self.keep[tokens]

    def with_output_subset(self, keep: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> OnnxModel:
        """The model scoring only the target ids `keep` (ascending, the specials first)."""
        subset = copy.copy(self)
        subset.keep, subset.weight_t, subset.bias = keep, np.ascontiguousarray(weight[keep].T), bias[keep]
        return subset


@dataclass
class Shortlist:
    targets: np.ndarray                     # (src_vocab, k) target ids per source id, best first, -1 where fewer
    always: np.ndarray                      # (n,) target ids every batch keeps
    tgt_size: int
    output: tuple[np.ndarray, np.ndarray]   # the output layer W_s (vocab, dec_hidden), b_s (vocab,), float32

    @classmethod
    def load(cls, manifest: Manifest, k: int = 0) -> Shortlist:
        """The folder's shortlist and output layer; `k` > 0 keeps the first k targets of each source id."""
        info = manifest.shortlist or {}
        try:
            with np.load(manifest.path(str(info["file"])), allow_pickle=False) as arrays:
                targets, frequent = arrays["targets"].astype(np.int64), arrays["frequent"].astype(np.int64)
            with np.load(manifest.path(str(info.get("output", "output.npz"))), allow_pickle=False) as arrays:
                weight, bias = arrays["W_s"].astype(np.float32), arrays["b_s"].astype(np.float32)
        except OnnxFolderError:
            raise                                            # names the file, and the remedy
        except (OSError, KeyError, ValueError) as exc:
            raise OnnxFolderError(f"{manifest.folder}: the shortlist cannot be read ({exc}); export it again") from None
        v = manifest.vocab_size
        if targets.ndim != 2 or weight.shape[0] != v or bias.shape != (v,) or max(
                int(targets.max(initial=0)), int(frequent.max(initial=0))) >= v:
            raise OnnxFolderError(f"{manifest.folder}: the shortlist does not fit the vocabulary; export it again")
        if k:
            targets = targets[:, :k]
        return cls(targets, np.union1d(np.arange(EOS + 1), frequent), v, (weight, bias))

    def select(self, src: np.ndarray, extra: np.ndarray | None = None) -> np.ndarray:
        """src: (batch, src_len); extra: a prefix's ids (PAD allowed) -> keep (subset,) ascending target ids."""
        kept = np.zeros(self.tgt_size, bool)
        kept[self.always] = True
        candidates = self.targets[src.reshape(-1)]             # (batch*src_len, k)
        kept[candidates[candidates >= 0]] = True
        if extra is not None:
            kept[extra.reshape(-1)] = True
        return np.flatnonzero(kept)

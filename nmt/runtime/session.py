"""The exported encoder and step as onnxruntime sessions, in the shape the numpy searches call them.

Memory tensors have one row per sentence (batch axis 0); state tensors one row per hypothesis, on the
batch axis the manifest gives. The step groups a sentence's consecutive rows as the PyTorch step does.
With a shortlist, the step's `features` h̃ (rows, dec_hidden) are scored against only the kept rows of
the output layer, W_s[keep] h̃ + b_s[keep], and normalised over them, as the PyTorch shortlist view does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nmt.runtime.folder import Manifest, OnnxFolderError


@dataclass
class Tensors:
    """Named arrays that searches reorder and shrink along each one's batch axis."""

    arrays: dict[str, np.ndarray]
    axes: dict[str, int]
    graph: str = "beam"                 # which step graph these belong to ("greedy" or "beam")

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

    def __init__(self, manifest: Manifest, threads: int = 0) -> None:
        try:
            import onnxruntime as ort
        except ImportError:
            raise OnnxFolderError("an ONNX model folder needs onnxruntime: pip install onnxruntime") from None
        self.manifest = manifest
        options = session_options(threads)
        sessions: dict[str, Any] = {}
        for graphs in manifest.graphs.values():
            for name in graphs.values():
                if name not in sessions:
                    try:
                        sessions[name] = ort.InferenceSession(str(manifest.path(name)), options,
                                                              providers=["CPUExecutionProvider"])
                    except Exception as exc:       # onnxruntime's own exception classes
                        raise OnnxFolderError(f"{manifest.folder / name}: onnxruntime cannot load it "
                                              f"({' '.join(str(exc).split())[:300]})") from None
        self.graph = {kind: {role: sessions[name] for role, name in graphs.items()}
                      for kind, graphs in manifest.graphs.items()}
        self.state_axes = dict(manifest.state)
        self.step_outputs = ["log_probs", *(f"next_{name}" for name, _ in manifest.state), "attention"]

    def encode(self, src: np.ndarray, src_lengths: np.ndarray, greedy: bool) -> tuple[Tensors, Tensors]:
        """src: (batch, src_len) int64 -> memory, initial state (one row per sentence)."""
        kind = "greedy" if greedy else "beam"
        outputs = self.graph[kind]["encoder"].run(None, {"src": src, "src_lengths": src_lengths})
        names = self.manifest.memory[kind]
        memory = Tensors(dict(zip(names, outputs[: len(names)], strict=True)), dict.fromkeys(names, 0), kind)
        state = Tensors(dict(zip(self.state_axes, outputs[len(names):], strict=True)), self.state_axes, kind)
        return memory, state

    def run_step(self, role: str, prev: np.ndarray, state: Tensors,
                 memory: Tensors) -> tuple[np.ndarray, Tensors, np.ndarray]:
        """The `role` graph ("step" or "step_features") -> its first output, the new state, attention."""
        names = self.step_outputs if role == "step" else ["features", *self.step_outputs[1:]]
        outputs = self.graph[memory.graph][role].run(names, {"prev_tokens": prev, **state.arrays, **memory.arrays})
        new_state = Tensors(dict(zip(self.state_axes, outputs[1:-1], strict=True)), self.state_axes, state.graph)
        return outputs[0], new_state, outputs[-1].astype(np.float32, copy=False)

    def step(self, prev: np.ndarray, state: Tensors, memory: Tensors) -> tuple[np.ndarray, Tensors, np.ndarray]:
        """prev: (rows,) -> log p (rows, vocab) float32, the new state, attention (rows, src_len)."""
        return self.run_step("step", prev, state, memory)

    def vocab_ids(self, tokens: np.ndarray) -> np.ndarray:
        return tokens

    def with_output_subset(self, keep: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> SubsetModel:
        """The model scoring only the target ids `keep` (ascending, the specials first)."""
        return SubsetModel(self, keep, np.ascontiguousarray(weight[keep].T), bias[keep])


class SubsetModel:
    """An OnnxModel whose steps score only `keep`'s output rows; tokens are positions in `keep`."""

    def __init__(self, model: OnnxModel, keep: np.ndarray, weight_t: np.ndarray, bias: np.ndarray) -> None:
        self.model, self.keep = model, keep
        self.weight_t, self.bias = weight_t, bias            # (dec_hidden, subset), (subset,)

    def encode(self, src: np.ndarray, src_lengths: np.ndarray, greedy: bool) -> tuple[Tensors, Tensors]:
        return self.model.encode(src, src_lengths, greedy)

    def step(self, prev: np.ndarray, state: Tensors, memory: Tensors) -> tuple[np.ndarray, Tensors, np.ndarray]:
        features, state, attention = self.model.run_step("step_features", self.keep[prev], state, memory)
        logits = features.astype(np.float32, copy=False) @ self.weight_t + self.bias   # (rows, subset)
        return log_softmax(logits), state, attention

    def vocab_ids(self, tokens: np.ndarray) -> np.ndarray:
        return self.keep[tokens]

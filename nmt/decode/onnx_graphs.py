"""`Decoding.encode` and `Decoding.step` (the weights the PyTorch searches use, not a copy of the equations)
traced into ONNX graphs, `Memory` and `DecoderState` as named tensors. A trace records one path through the
code, so `check_graphs` runs the graphs on onnxruntime at other shapes than the traced ones against the model.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from nmt.data.special import BOS, EOS, PAD
from nmt.decode.steps import Decoding
from nmt.model.attention import Memory
from nmt.model.decoder import DecoderState

OPSET = 17
WEIGHT_ELEMENTS = 1024          # a traced constant this large is a weight (see `_weights_as_initializers`)
TOLERANCE = 1e-4                # float32: max |log p| difference between a graph and the model
ANY_VALUE = float(np.finfo(np.float32).max)     # int8: any value, but the shapes and -inf where the model's


class OnnxExportError(ValueError):
    """A model the exporter cannot turn into graphs that compute what it computes."""


@dataclass(frozen=True)
class Layout:
    """The tensors a graph passes between encoder and steps, by name."""

    memory: tuple[str, ...]             # `Memory` fields, batch axis 0; pad_bias stands for the mask
    state: tuple[tuple[str, int], ...]  # (`DecoderState` field, its batch axis); hidden: (layers, rows, dec_hidden)

    @classmethod
    def of(cls, memory: Memory, state: DecoderState) -> Layout:
        present = {"values": True, "keys": memory.keys is not memory.values,
                   "context_terms": memory.context_terms is not None, "pad_bias": True}
        fields = [("hidden", 1), ("cell", 1), ("feed", 0)]
        return cls(tuple(name for name, kept in present.items() if kept),
                   tuple((name, axis) for name, axis in fields if getattr(state, name) is not None))

    @property
    def state_names(self) -> list[str]:
        return [name for name, _ in self.state]

    def flatten(self, memory: Memory | None, state: DecoderState | None) -> list[Tensor]:
        """The memory's tensors, then the state's (either left out when None)."""
        tensors = [getattr(memory, name) for name in self.memory] if memory is not None else []
        return tensors + ([getattr(state, name) for name in self.state_names] if state is not None else [])

    def unflatten(self, tensors: tuple[Tensor, ...]) -> tuple[DecoderState, Memory]:
        """A step graph's inputs after prev_tokens: state tensors, then memory tensors."""
        count = len(self.state)
        state = DecoderState(**dict(zip(self.state_names, tensors[:count], strict=True)))
        given = dict(zip(self.memory, tensors[count:], strict=True))
        pad_bias = given["pad_bias"]
        memory = Memory(given["values"], given.get("keys", given["values"]), pad_bias == 0,
                        given.get("context_terms"), pad_bias)
        return state, memory


class Graph(nn.Module):
    """A graph's module: the encoder's (src, src_lengths) -> memory tensors, then the initial state's; a step's
    (prev_tokens, *state, *memory) -> log p float32 (step_features: h̃, for the runtime's own output rows),
    the next state, attention (rows, src_len). Rows come k consecutive per sentence, as in the searches."""

    def __init__(self, decoding: Decoding, layout: Layout, role: str, fold_context: bool) -> None:
        super().__init__()
        self.model = decoding.model                 # registered: its parameters become the graph's initializers
        self.decoding, self.layout, self.role, self.fold_context = decoding, layout, role, fold_context

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        if self.role == "encoder":
            src, src_lengths = inputs
            return tuple(self.layout.flatten(*self.decoding.encode(src, src_lengths, self.fold_context)))
        state, memory = self.layout.unflatten(inputs[1:])
        if self.role == "step_features":            # h̃: what the shortlist's rows of W_s multiply
            out, state, weights = self.decoding.steps().features(inputs[0], state, memory)
        else:
            logits, state, weights = self.decoding.step(inputs[0], state, memory)
            out = logits.log_softmax(-1, dtype=torch.float32)            # (rows, vocab), what the searches take
        return (out, *self.layout.flatten(None, state), weights.float())


def graph_names(layout: Layout, role: str) -> tuple[list[str], list[str], dict[str, dict[int, str]]]:
    """The input names, output names and dynamic axes of the graph `role` (encoder, step, step_features)."""
    axes: dict[str, dict[int, str]] = {name: {0: "batch", 1: "src_len"} for name in layout.memory}
    if role == "encoder":
        axes.update({"src": {0: "batch", 1: "src_len"}, "src_lengths": {0: "batch"}})
        axes.update({name: {axis: "batch"} for name, axis in layout.state})
        return ["src", "src_lengths"], [*layout.memory, *layout.state_names], axes
    first = "features" if role == "step_features" else "log_probs"
    axes.update({"prev_tokens": {0: "rows"}, first: {0: "rows"}, "attention": {0: "rows", 1: "src_len"}})
    for name, axis in layout.state:
        axes[name] = axes[f"next_{name}"] = {axis: "rows"}
    outputs = [first, *(f"next_{name}" for name in layout.state_names), "attention"]
    return ["prev_tokens", *layout.state_names, *layout.memory], outputs, axes


def example_batch(src_vocab: int, lengths: list[int], seed: int) -> tuple[Tensor, Tensor]:
    """Random sources of `lengths` (EOS included), PAD-padded: (batch, max length), (batch,)."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD, dtype=torch.long)
    for row, length in enumerate(lengths):
        src[row, : length - 1] = torch.randint(EOS + 1, max(src_vocab, EOS + 2), (length - 1,), generator=generator)
        src[row, length - 1] = EOS
    return src, torch.tensor(lengths)


def beam_rows(memory: Memory, state: DecoderState, k: int, vocab: int, seed: int) -> tuple[Tensor, DecoderState]:
    """k rows per sentence of the initial state, and random previous tokens for them (BOS in the first row)."""
    batch = memory.values.size(0)
    generator = torch.Generator().manual_seed(seed)
    prev = torch.randint(EOS + 1, max(vocab, EOS + 2), (batch * k,), generator=generator)
    prev[0] = BOS
    return prev, state.index_select(torch.arange(batch).repeat_interleave(k))


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """fd 2 to /dev/null: the exporter's C++ side warns there, past Python's filters, of what `check_graphs`
    tests anyway."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def trace(module: nn.Module, args: tuple[Tensor, ...], path: Path,
          names: tuple[list[str], list[str], dict[str, dict[int, str]]]) -> None:
    """torch.onnx.export (TorchScript tracing), its warnings silenced: `check_graphs` tests the result."""
    inputs, outputs, axes = names
    module.eval()     # else the exporter restores training mode recursively: dropout on in every later graph
    with warnings.catch_warnings(), torch.no_grad(), _quiet_stderr():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs, dynamic_axes=axes,
                          opset_version=OPSET, do_constant_folding=True, dynamo=False,
                          training=torch.onnx.TrainingMode.EVAL)
    _weights_as_initializers(path)


def _weights_as_initializers(path: Path) -> None:
    """The tracer records derived weights (token table, [W_h; W_a], padded W_s) as Constant nodes; as
    initializers onnxruntime's quantization converts them too."""
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    for node in list(graph.node):
        tensor = node.attribute[0].t if node.op_type == "Constant" and node.attribute[0].name == "value" else None
        if tensor is not None and len(tensor.dims) >= 1 and np.prod(tensor.dims) >= WEIGHT_ELEMENTS:
            tensor.name = node.output[0]
            graph.initializer.append(tensor)
            graph.node.remove(node)
    onnx.save(model, str(path))


def layout_of(decoding: Decoding, fold_context: bool, src_vocab: int) -> Layout:
    """The layout of the memory `Decoding.encode(fold_context=...)` makes."""
    with torch.no_grad():
        return Layout.of(*decoding.encode(*example_batch(src_vocab, [3, 2], seed=0), fold_context))


def export_pair(decoding: Decoding, folder: Path, fold_context: bool, files: dict[str, str],
                src_vocab: int) -> Layout:
    """The graphs `files` names (encoder, step[, step_features]) of one memory kind into `folder`, traced
    on unsorted lengths with padding and two rows per sentence."""
    src, lengths = example_batch(src_vocab, [6, 3, 5], seed=1)
    with torch.no_grad():               # derived weights built now are plain tensors: constants in the graphs
        memory, state = decoding.encode(src, lengths, fold_context)
        layout = Layout.of(memory, state)
        prev, rows = beam_rows(memory, state, 2, decoding.vocab_size, seed=2)
        decoding.step(prev, rows, memory)
    step_args = (prev, *layout.flatten(None, rows), *layout.flatten(memory, None))
    for role, file in files.items():
        trace(Graph(decoding, layout, role, fold_context), (src, lengths) if role == "encoder" else step_args,
              folder / file, graph_names(layout, role))
    return layout


def _runner(path: Path) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    """An onnxruntime session on one thread whose failures (to load the graph or to run it) are export errors."""
    import onnxruntime

    def failing(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:        # onnxruntime's own exception types
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            raise OnnxExportError(f"onnxruntime cannot run the exported {path.name} ({first}); "
                                  "this model cannot be exported to ONNX by this nmt") from None

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = failing(lambda: onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]))
    return lambda feed: failing(lambda: session.run(None, feed))


def _largest_difference(expected: list[Tensor], got: list[np.ndarray], real: Tensor | None = None) -> float:
    """Max |difference| where both are finite; inf where the shapes or the infinite positions differ. `real`:
    (batch, src_len), for memory tensors: where attention looks (eager and traced padding may differ)."""
    worst = 0.0
    for tensor, have in zip(expected, got, strict=True):
        want = tensor.detach().float().numpy()
        if want.shape != have.shape or not np.array_equal(np.isfinite(want), np.isfinite(have)):
            return float("inf")
        compared = np.isfinite(want)
        if real is not None:
            compared &= real.numpy().reshape(*real.shape, *[1] * (want.ndim - 2))
        if compared.any():
            worst = max(worst, float(np.abs(want[compared] - have[compared]).max()))
    return worst


def check_graphs(decoding: Decoding, folder: Path, fold_context: bool, files: dict[str, str], layout: Layout,
                 src_vocab: int, tolerance: float = TOLERANCE) -> float:
    """The graphs on onnxruntime against the model at untraced shapes (batch 1, 2, 4; 1 and 3 rows per
    sentence; two steps, to use a fed-back state): the largest difference, an `OnnxExportError` past `tolerance`."""
    encoder, step = _runner(folder / files["encoder"]), _runner(folder / files["step"])
    features = _runner(folder / files["step_features"]) if "step_features" in files else None
    worst = 0.0
    for lengths, k in (([9, 4], 3), ([1], 1), ([2, 8, 8, 5], 1)):
        src, src_lengths = example_batch(src_vocab, lengths, seed=len(lengths))
        with torch.no_grad():
            memory, rows = decoding.encode(src, src_lengths, fold_context)
        got = encoder({"src": src.numpy(), "src_lengths": src_lengths.numpy()})
        count = len(layout.memory)
        worst = max(worst, _largest_difference(layout.flatten(memory, None), got[:count], src != PAD),
                    _largest_difference(layout.flatten(None, rows), got[count:]))
        prev, rows = beam_rows(memory, rows, k, decoding.vocab_size, seed=k)
        memory_feed = dict(zip(layout.memory, got[:count], strict=True))
        for _ in range(2):
            feed = {"prev_tokens": prev.numpy(), **memory_feed,
                    **{name: t.numpy() for name, t in zip(layout.state_names, layout.flatten(None, rows), strict=True)}}
            with torch.no_grad():
                logits, next_rows, weights = decoding.step(prev, rows, memory)
                log_probs = logits.log_softmax(-1, dtype=torch.float32)
                after = [*layout.flatten(None, next_rows), weights]
                worst = max(worst, _largest_difference([log_probs, *after], step(feed)))
                if features is not None:
                    h, _, _ = decoding.steps().features(prev, rows, memory)
                    worst = max(worst, _largest_difference([h, *after], features(feed)))
            prev, rows = log_probs.argmax(-1), next_rows
    if not worst <= tolerance:
        raise OnnxExportError(f"the exported graphs disagree with the model (largest difference {worst:.3g}, "
                              f"allowed {tolerance:g}); this model cannot be exported to ONNX by this nmt")
    return worst


def quantize_int8(path: Path) -> None:
    """Replace the float32 graph at `path` by onnxruntime's dynamic int8 quantization of it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized = path.with_name(f".int8-{path.name}")
    logger = logging.getLogger()                    # it logs advice (pre-processing) and skipped tensors there
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_dynamic(str(path), str(quantized), weight_type=QuantType.QInt8)
    finally:
        logger.setLevel(level)
    quantized.replace(path)

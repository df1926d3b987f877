"""The decoder's inference step traced into ONNX graphs: an encoder graph and a one-step graph.

Each graph is a small module around `Decoding.encode` or `Decoding.step` (the same fused, folded and
padded weights the PyTorch searches use, not a copy of the equations), with `Memory` and `DecoderState`
flattened to named tensors. They are traced by PyTorch's TorchScript exporter with dynamic batch, row and
source-length axes. Tracing records one path through the Python code, so `check_graphs` runs every graph
on onnxruntime at other batch sizes, source lengths and beam widths than the traced ones and compares it
with the model (1e-4 in log p); a graph that disagrees is never written out as a success.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
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
from nmt.model.seq2seq import Seq2Seq

OPSET = 17
WEIGHT_ELEMENTS = 1024          # a traced constant this large is a weight (see `_weights_as_initializers`)
TOLERANCE = 1e-4                # float32: max |log p| difference between a graph and the model
ANY_VALUE = float(np.finfo(np.float32).max)     # int8: any value, but the shapes and -inf where the model's


class OnnxExportError(ValueError):
    """A model the exporter cannot turn into graphs that compute what it computes."""


@dataclass(frozen=True)
class Layout:
    """The tensors a graph passes between encoder and steps, by name.

    memory: fields of `Memory` the encoder returns, batch axis 0 (keys only when they differ from the
        values, context_terms only for a folded memory); pad_bias stands for the mask.
    state: (field of `DecoderState`, its batch axis): hidden and cell are (layers, rows, dec_hidden)."""

    memory: tuple[str, ...]
    state: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, memory: Memory, state: DecoderState) -> Layout:
        names = ["values"]
        if memory.keys is not memory.values:
            names.append("keys")
        if memory.context_terms is not None:
            names.append("context_terms")
        names.append("pad_bias")
        fields = [("hidden", 1), ("cell", 1), ("feed", 0)]
        return cls(tuple(names), tuple((name, axis) for name, axis in fields if getattr(state, name) is not None))

    @property
    def state_names(self) -> list[str]:
        return [name for name, _ in self.state]

    def flatten(self, memory: Memory | None, state: DecoderState | None) -> list[Tensor]:
        """The memory's tensors, then the state's (either left out when None), in this layout's order."""
        tensors = [getattr(memory, name) for name in self.memory] if memory is not None else []
        return tensors + ([getattr(state, name) for name in self.state_names] if state is not None else [])

    def unflatten(self, tensors: tuple[Tensor, ...]) -> tuple[DecoderState, Memory]:
        """State tensors then memory tensors (a step graph's inputs after prev_tokens) -> the objects."""
        count = len(self.state)
        state = DecoderState(**dict(zip(self.state_names, tensors[:count], strict=True)))
        given = dict(zip(self.memory, tensors[count:], strict=True))
        pad_bias = given["pad_bias"]
        memory = Memory(given["values"], given.get("keys", given["values"]), pad_bias == 0,
                        given.get("context_terms"), pad_bias)
        return state, memory


def inference_step(model: Seq2Seq) -> Decoding:
    """The model with its inference step, as the searches decode with it (float32, full vocabulary)."""
    return Decoding(model)


def step_features(decoding: Decoding, prev_tokens: Tensor, state: DecoderState,
                  memory: Memory) -> tuple[Tensor, DecoderState, Tensor]:
    """`Decoding.step` short of the output layer: h̃ (rows, dec_hidden), new state, attention."""
    return decoding.steps().features(prev_tokens, state, memory)


class EncoderGraph(nn.Module):
    """(src, src_lengths) -> the memory's tensors, then the initial state's."""

    def __init__(self, decoding: Decoding, layout: Layout, fold_context: bool) -> None:
        super().__init__()
        self.model = decoding.model                 # registered: its parameters become the graph's initializers
        self.decoding, self.layout, self.fold_context = decoding, layout, fold_context

    def forward(self, src: Tensor, src_lengths: Tensor) -> tuple[Tensor, ...]:
        memory, state = self.decoding.encode(src, src_lengths, self.fold_context)
        return tuple(self.layout.flatten(memory, state))


class StepGraph(nn.Module):
    """(prev_tokens, *state, *memory) -> log p in float32 (or, with `features`, h̃ for the runtime's own output
    rows), the next state, attention (rows, src_len). Rows come k consecutive per sentence, as in the searches."""

    def __init__(self, decoding: Decoding, layout: Layout, features: bool = False) -> None:
        super().__init__()
        self.model = decoding.model
        self.decoding, self.layout, self.features = decoding, layout, features

    def forward(self, prev_tokens: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
        state, memory = self.layout.unflatten(tensors)
        if self.features:                           # h̃: what the shortlist's rows of W_s multiply
            out, state, weights = step_features(self.decoding, prev_tokens, state, memory)
        else:
            logits, state, weights = self.decoding.step(prev_tokens, state, memory)
            out = logits.log_softmax(-1, dtype=torch.float32)            # (rows, vocab), what the searches take
        return (out, *self.layout.flatten(None, state), weights.float())


def encoder_names(layout: Layout) -> tuple[list[str], list[str], dict[str, dict[int, str]]]:
    """Input names, output names and dynamic axes of an encoder graph."""
    axes: dict[str, dict[int, str]] = {"src": {0: "batch", 1: "src_len"}, "src_lengths": {0: "batch"}}
    axes.update({name: {0: "batch", 1: "src_len"} for name in layout.memory})
    axes.update({name: {axis: "batch"} for name, axis in layout.state})
    return ["src", "src_lengths"], [*layout.memory, *layout.state_names], axes


def step_names(layout: Layout, features: bool) -> tuple[list[str], list[str], dict[str, dict[int, str]]]:
    """Input names, output names and dynamic axes of a step graph."""
    first = "features" if features else "log_probs"
    outputs = [first, *(f"next_{name}" for name in layout.state_names), "attention"]
    axes: dict[str, dict[int, str]] = {"prev_tokens": {0: "rows"}, first: {0: "rows"},
                                       "attention": {0: "rows", 1: "src_len"}}
    for name, axis in layout.state:
        axes[name] = axes[f"next_{name}"] = {axis: "rows"}
    axes.update({name: {0: "batch", 1: "src_len"} for name in layout.memory})
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
    """File descriptor 2 to /dev/null: the exporter's C++ side warns there of what `check_graphs` tests anyway
    (shape inference of packed sequences), past Python's warning filters."""
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
    """torch.onnx.export (TorchScript tracing), its expected warnings silenced: `check_graphs` tests the result."""
    inputs, outputs, axes = names
    module.eval()     # a new module is in training mode, which the exporter restores afterwards, recursively:
                      # the model's dropout would be on for every later graph and check
    with warnings.catch_warnings(), torch.no_grad(), _quiet_stderr():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs, dynamic_axes=axes,
                          opset_version=OPSET, do_constant_folding=True, dynamo=False,
                          training=torch.onnx.TrainingMode.EVAL)
    _weights_as_initializers(path)


def _weights_as_initializers(path: Path) -> None:
    """The tracer records the derived weights of the inference step (the token table, [W_h; W_a], padded W_s)
    as Constant nodes; as initializers, like the parameters, onnxruntime's quantization sees and converts them."""
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
    """Trace the encoder and step graphs (and the step_features graph when `files` names one) of one memory
    kind into `folder`, as files["encoder"], files["step"], files["step_features"]. Traced on a batch of
    unsorted lengths with padding, and two rows per sentence."""
    src, lengths = example_batch(src_vocab, [6, 3, 5], seed=1)
    with torch.no_grad():               # derived weights built now are plain tensors: constants in the graphs
        memory, state = decoding.encode(src, lengths, fold_context)
        layout = Layout.of(memory, state)
        prev, rows = beam_rows(memory, state, 2, decoding.vocab_size, seed=2)
        decoding.step(prev, rows, memory)
    trace(EncoderGraph(decoding, layout, fold_context), (src, lengths), folder / files["encoder"],
          encoder_names(layout))
    step_args = (prev, *layout.flatten(None, rows), *layout.flatten(memory, None))
    trace(StepGraph(decoding, layout), step_args, folder / files["step"], step_names(layout, False))
    if "step_features" in files:
        trace(StepGraph(decoding, layout, features=True), step_args, folder / files["step_features"],
              step_names(layout, True))
    return layout


class _Session:
    """An onnxruntime session on one thread whose failures (to load a graph or to run it) are export errors."""

    def __init__(self, path: Path) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        self.name = path.name
        self.session: Any = self._failing(lambda: onnxruntime.InferenceSession(
            str(path), options, providers=["CPUExecutionProvider"]))

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self._failing(lambda: self.session.run(None, feed))

    def _failing(self, call: Any) -> Any:
        try:
            return call()
        except Exception as exc:        # onnxruntime's own exception types
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            raise OnnxExportError(f"onnxruntime cannot run the exported {self.name} ({first}); "
                                  "this model cannot be exported to ONNX by this nmt") from None


def _difference(expected: Tensor, got: np.ndarray, real: Tensor | None = None) -> float:
    """Max |difference| where both are finite; inf when the shapes or the infinite positions differ.
    `real`: (batch, src_len), True at real source positions: for memory tensors, where attention looks
    (at the padding, eager decoding leaves zeros where a trace may project the zero annotations)."""
    want = expected.detach().float().numpy()
    if want.shape != got.shape or not np.array_equal(np.isfinite(want), np.isfinite(got)):
        return float("inf")
    compared = np.isfinite(want)
    if real is not None:
        compared &= real.numpy().reshape(*real.shape, *[1] * (want.ndim - 2))
    return float(np.abs(want[compared] - got[compared]).max()) if compared.any() else 0.0


def _largest_difference(expected: list[Tensor], got: list[np.ndarray], real: Tensor | None = None) -> float:
    return max(_difference(want, have, real) for want, have in zip(expected, got, strict=True))


def check_graphs(decoding: Decoding, folder: Path, fold_context: bool, files: dict[str, str], layout: Layout,
                 src_vocab: int, tolerance: float = TOLERANCE) -> float:
    """Run the graphs on onnxruntime at shapes other than the traced ones (batch 1, 2 and 4, one-token and
    longer sources, 1 and 3 rows per sentence, two steps so a fed-back state is used) against the model;
    returns the largest difference, an `OnnxExportError` beyond `tolerance`."""
    encoder, step = _Session(folder / files["encoder"]), _Session(folder / files["step"])
    features = _Session(folder / files["step_features"]) if "step_features" in files else None
    worst = 0.0
    for lengths, k in (([9, 4], 3), ([1], 1), ([2, 8, 8, 5], 1)):
        src, src_lengths = example_batch(src_vocab, lengths, seed=len(lengths))
        with torch.no_grad():
            memory, rows = decoding.encode(src, src_lengths, fold_context)
        got = encoder.run({"src": src.numpy(), "src_lengths": src_lengths.numpy()})
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
                worst = max(worst, _largest_difference([log_probs, *after], step.run(feed)))
                if features is not None:
                    h, _, _ = step_features(decoding, prev, rows, memory)
                    worst = max(worst, _largest_difference([h, *after], features.run(feed)))
            prev, rows = log_probs.argmax(-1), next_rows
    if not worst <= tolerance:
        raise OnnxExportError(f"the exported graphs disagree with the model (largest difference {worst:.3g}, "
                              f"allowed {tolerance:g}); this model cannot be exported to ONNX by this nmt")
    return worst


def quantize_int8(path: Path) -> None:
    """Replace the float32 graph at `path` by onnxruntime's dynamic int8 quantization of it (int8 weights
    of the matrix products, activations quantized per call)."""
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

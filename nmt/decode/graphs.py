"""Greedy and beam search on a GPU, `STEPS_PER_GRAPH` decoder steps captured as one CUDA graph per shape: one
launch and one host sync per chunk, not dozens of tiny kernels launched from Python per step. The rule of
nmt.decode.rule with static books: the batch padded to a bucket (padded rows start ended), no row dropped (a done
beam sentence decodes on unmasked: nothing it finishes later can enter its n best, except with early_stop), a step
only records tokens, parent rows and finishing scores, the hypotheses put together after the last step. Outputs
equal the eager searches' (tests/test_graphed.py, tests/test_cuda.py) up to last bits another batch shape may
change."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from torch import Tensor

from nmt.data.batching import bucket_size
from nmt.data.special import BOS, EOS, PAD
from nmt.decode.rule import (
    NEG_INF,
    Bans,
    Hypothesis,
    beam_step,
    collect,
    collect_beams,
    length_penalty,
    output_limits,
    sentence_done,
    step_logp,
)
from nmt.decode.search import SearchModel
from nmt.decode.settings import SearchSettings
from nmt.decode.steps import Decoding
from nmt.device import active_autocast_dtype, capturing
from nmt.model.attention import Memory
from nmt.model.decoder import DecoderState

STEPS_PER_GRAPH = 8        # steps per replay: fewer host syncs against up to 7 steps decoded past the end
MAX_GRAPHS = 48            # shapes kept (least recently used dropped first): a server's GPU memory stays bounded,
GRAPH_MEMORY_SHARE = 0.25  # and so does their static tensors' share of the GPU's memory


def static_shape(sentences: int, src_len: int) -> tuple[int, int]:
    """The (sentences, source length) a batch is padded to: its graph's shape (`bucket_size`, steps of 8)."""
    return bucket_size(sentences, 8), bucket_size(src_len, 8)


@dataclass
class _Static:
    """The tensors a captured graph reads and writes, at addresses fixed at capture."""

    memory: Memory              # (sentences, src_len, ...) padded copies of the batch's memory
    hidden: Tensor              # (layers, rows, dec_hidden)
    cell: Tensor | None         # (layers, rows, dec_hidden), LSTM
    feed: Tensor | None         # (rows, dec_hidden), Luong input feeding
    prev: Tensor                # (rows,) the previous output token
    limits: Tensor              # (sentences,) output length limits, EOS included
    step: Tensor                # () the output position of the chunk's next step
    out_tokens: Tensor          # (rows, STEPS_PER_GRAPH) each step's token
    going: Tensor               # greedy: (rows,) not ended; beam: (sentences,) still searching

    def state(self) -> DecoderState:
        return DecoderState(self.hidden, self.cell, self.feed)

    def nbytes(self) -> int:
        tensors = [getattr(self, f.name) for f in fields(self) if f.name != "memory"]
        tensors += [getattr(self.memory, f.name) for f in fields(Memory)]
        return sum(t.nbytes for t in tensors if t is not None)

    def store_state(self, state: DecoderState) -> None:
        """A batch's state into the first rows, the others zeroed; a chunk's into all."""
        for target, value in ((self.hidden, state.hidden), (self.cell, state.cell), (self.feed, state.feed)):
            if target is not None and value is not None:
                if value.size(-2) < target.size(-2):
                    target.zero_()
                target[..., : value.size(-2), :] = value

    def load(self, memory: Memory, state: DecoderState, limits: Tensor) -> None:
        """A batch in (the padding zeroed, the padded sentences ended before they start), the counters reset."""
        batch = limits.size(0)
        for f in fields(Memory):
            target, value = getattr(self.memory, f.name), getattr(memory, f.name)
            if target is not None:
                target.fill_(NEG_INF if f.name == "pad_bias" else 0)
                target[: value.size(0), : value.size(1)] = value
        self.memory.mask[batch:, 0] = True          # a padded sentence attends to one zero position: a finite softmax
        self.memory.pad_bias[batch:, 0] = 0.0
        self.store_state(state)
        self.prev.fill_(BOS)
        self.step.zero_()
        self.limits.fill_(1)
        self.limits[:batch] = limits
        self.going.zero_()
        self.going[:batch] = True


@dataclass
class _GreedyStatic(_Static):
    out_logp: Tensor            # (rows, STEPS_PER_GRAPH) each step's log p


@dataclass
class _BeamStatic(_Static):
    scores: Tensor              # (rows,) alive log p
    out_parents: Tensor         # (rows, STEPS_PER_GRAPH) each step's parent row
    out_fin: Tensor             # (sentences, STEPS_PER_GRAPH, beam) the step's finishing scores, -inf for others
    out_fin_rows: Tensor        # (sentences, STEPS_PER_GRAPH, 2 beam) the alive rows the candidates come from
    kept: Tensor                # (sentences, n_best) the best finished scores so far
    top_ended: Tensor           # (sentences,) early_stop: a best candidate ended

    def load(self, memory: Memory, state: DecoderState, limits: Tensor) -> None:
        super().load(memory, state, limits)
        alive = self.scores.view(self.limits.size(0), -1)                   # (sentences, k)
        alive.fill_(NEG_INF)
        alive[: limits.size(0), 0] = 0.0                                    # one live beam per real sentence
        self.top_ended.zero_()
        self.kept.fill_(NEG_INF)


@dataclass
class _ChunkConstants:
    """What every step of a chunk reads and none changes, made inside the graph (a tensor from outside would
    have to outlive it) once per chunk: each operation out of the step loop is STEPS_PER_GRAPH fewer kernels."""

    positions: Tensor           # (STEPS_PER_GRAPH,) the output position of each step
    at_limit: Tensor            # (rows, STEPS_PER_GRAPH) step j is the row's last allowed position (or past it)
    eos_banned: Tensor | None   # (rows, STEPS_PER_GRAPH) no EOS at step j: before min_len, unless at the limit
    bans: Bans
    neg_inf: Tensor             # () what `torch.where` fills in (a Python number: a new tensor, a kernel, per call)

    @classmethod
    def make(cls, s: _Static, row_limits: Tensor, vocab: int, min_len: int) -> _ChunkConstants:
        device = row_limits.device
        positions = s.step + torch.arange(STEPS_PER_GRAPH, device=device)
        at_limit = (row_limits - 1).unsqueeze(1) <= positions
        return cls(positions, at_limit, (positions < min_len) & ~at_limit if min_len else None,
                   Bans.make(vocab, device), torch.full((), NEG_INF, dtype=torch.float32, device=device))

    def logp(self, logits: Tensor, j: int) -> Tensor:
        """The rule's `step_logp` for the chunk's step j, whose position is on the device."""
        eos_banned = self.eos_banned[:, j] if self.eos_banned is not None else None
        return step_logp(logits, self.bans, eos_banned, self.at_limit[:, j], masked=True)


class SearchGraphs:
    """Captured greedy and beam search chunks for one model, by shape and settings, read the model's derived
    weights as they were at capture: neither may change meanwhile. One search at a time: the graphs share one
    memory pool. `capture=False` runs the same chunks eagerly (the CPU, tests). `max_bytes`: what the kept shapes'
    static tensors may hold (default GRAPH_MEMORY_SHARE of the GPU's); a new shape drops the least recent ones."""

    def __init__(self, model: Decoding, capture: bool = True, max_bytes: float | None = None) -> None:
        self.model, self.capture = model, capture
        self.pool: Any = None                # the graphs' memory pool, made for the first shape kept
        self.stream: Any = torch.cuda.Stream(device=model.device) if capture else None     # captures go here
        if max_bytes is None and capture:
            max_bytes = GRAPH_MEMORY_SHARE * torch.cuda.get_device_properties(model.device).total_memory
        self.max_bytes = math.inf if max_bytes is None else max_bytes
        self.graphs: OrderedDict[tuple, tuple[Callable[[], None], Any]] = OrderedDict()   # oldest use first
        self.lock = threading.Lock()
        # what capturing has cost so far (a new shape's warm-up run, then its capture and instantiation)
        self.captured, self.warmup_seconds, self.capture_seconds = 0, 0.0, 0.0

    @classmethod
    def of(cls, model: SearchModel) -> SearchGraphs | None:
        """Graphs for one model on its whole vocabulary; None for what they cannot run (an ensemble)."""
        return cls(model) if isinstance(model, Decoding) and model.plain else None

    def runs(self, model: SearchModel, settings: SearchSettings, prefix: Tensor | None) -> bool:
        """Only this model's plain searches are graphed: sampling, prefixes, n-gram blocking, coverage,
        attention output and shortlists (another model: a view) take the eager path."""
        return (model is self.model and settings.sampler is None and prefix is None and not settings.no_repeat_ngram
                and not settings.coverage and not settings.return_attention)

    def search(self, src: Tensor, src_lengths: Tensor, settings: SearchSettings) -> list[list[Hypothesis]]:
        with self.lock:
            if settings.greedy:
                return [[h] for h in self.greedy(src, src_lengths, settings)]
            return self.beam(src, src_lengths, settings)

    def _graph(self, key: tuple, build: Callable[[torch.device | None], Any], chunk: Callable[[Any], None]
               ) -> tuple[Callable[[], None], Any]:
        """The replay function and static tensors of the chunk for `key`, captured on first use; `build(device)`
        allocates them, first on "meta": the shapes that make room go before the new one takes memory."""
        key = (*key, active_autocast_dtype(self.model.device.type))
        if key in self.graphs:
            self.graphs.move_to_end(key)
            return self.graphs[key]
        while len(self.graphs) >= MAX_GRAPHS:
            self.graphs.popitem(last=False)
        new_bytes = build(torch.device("meta")).nbytes()
        while self.graphs and self.kept_bytes + new_bytes > self.max_bytes:
            self.graphs.popitem(last=False)
        if not self.graphs:     # a pool that no graph holds any more is not captured into again (torch asserts)
            self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        static = build(None)
        if not self.capture:
            self.graphs[key] = (lambda: chunk(static), static)
            return self.graphs[key]
        start = time.perf_counter()
        chunk(static)                                # warm-up: builds derived weights, cuBLAS workspaces
        torch.cuda.synchronize(self.model.device)
        warmed = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        dtype = active_autocast_dtype("cuda")
        # autocast's cast cache does not survive a capture: off inside it
        with (torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=dtype is not None, cache_enabled=False),
              capturing(graph, self.pool, self.stream)):
            chunk(static)
        self.graphs[key] = (graph.replay, static)             # kept once captured: a failed capture is not
        self.captured += 1
        self.warmup_seconds += warmed - start
        self.capture_seconds += time.perf_counter() - warmed
        return self.graphs[key]

    @property
    def kept_bytes(self) -> int:
        return sum(static.nbytes() for _, static in self.graphs.values())

    def _on_model_device(self) -> AbstractContextManager[Any]:
        """cuda:N's warm-ups, captures and replays happen on N."""
        return torch.cuda.device(self.model.device) if self.capture else nullcontext()

    @torch.no_grad()
    def greedy(self, src: Tensor, src_lengths: Tensor, settings: SearchSettings = SearchSettings()
               ) -> list[Hypothesis]:
        """nmt.decode.search.greedy_search, graphed."""
        memory, state = self.model.encode(src, src_lengths, fold_context=False)
        batch, src_len = src.shape
        rows, padded_len = static_shape(batch, src_len)
        limits = output_limits(settings, src_lengths, src.device)
        steps = int(limits.max())
        with self._on_model_device():
            replay, s = self._graph(("greedy", rows, padded_len, settings.min_len),
                                    lambda device: _greedy_static(memory, state, rows, padded_len, device),
                                    _greedy_chunk(self.model, settings.min_len))
            s.load(memory, state, limits)
            tokens, logp = _replay(replay, s, steps, s.out_tokens[:batch], s.out_logp[:batch])   # (batch, steps)
        # a row's output ends at its first EOS, which every row reaches by its limit (at most `steps`)
        ends = tokens == EOS
        lengths = torch.where(ends.any(1), ends.int().argmax(1) + 1, tokens.size(1))     # (batch,) EOS included
        after = torch.arange(tokens.size(1), device=tokens.device) >= lengths.unsqueeze(1)
        # summed step by step in float32 (a running sum, as eager search's): the same score to the last bit
        summed = np.cumsum(logp.masked_fill(after, 0.0).cpu().numpy(), axis=1, dtype=np.float32)
        scores = torch.from_numpy(summed[:, -1])
        return collect(tokens.masked_fill(after, PAD), lengths, scores, None, src_lengths)

    @torch.no_grad()
    def beam(self, src: Tensor, src_lengths: Tensor, settings: SearchSettings = SearchSettings()
             ) -> list[list[Hypothesis]]:
        """nmt.decode.search.beam_search, graphed (see the module's docstring for the bookkeeping)."""
        k, n_best = settings.beam_size, min(settings.n_best, settings.beam_size)
        memory, state = self.model.encode(src, src_lengths)
        batch, src_len = src.shape
        sentences, padded_len = static_shape(batch, src_len)
        limits = output_limits(settings, src_lengths, src.device)
        steps = int(limits.max())
        state = state.index_select(torch.arange(batch * k, device=src.device) // k)    # k rows per sentence
        key = ("beam", sentences, padded_len, k, settings.alpha, settings.min_len, n_best, settings.early_stop)
        with self._on_model_device():
            replay, s = self._graph(key, lambda device: _beam_static(memory, state, sentences, padded_len, k,
                                                                     n_best, device),
                                    _beam_chunk(self.model, settings, sentences, src.device))
            s.load(memory, state, limits)
            tokens, parents, fin, fin_rows = _replay(replay, s, steps, s.out_tokens, s.out_parents,
                                                     s.out_fin[:batch], s.out_fin_rows[:batch, :, :k])
        # the best k finished over all steps, as eager search's pool keeps them (none finishes past `steps`);
        # of equal scores, the one that finished first
        ranked, order = fin.reshape(batch, -1).sort(dim=1, descending=True, stable=True)
        fin_scores, pick = ranked[:, :k], order[:, :k]                                     # (batch, k)
        fin_step = pick // k
        fin_row = fin_rows.reshape(batch, -1).gather(1, pick)
        found = _backtrack(tokens, parents, fin_step, fin_row, steps)
        fin_lengths = (fin_step + 1).masked_fill(fin_scores == NEG_INF, 0)
        return collect_beams(found, fin_lengths, fin_scores, None, settings.alpha, None, src_lengths, n_best)


def _replay(replay: Callable[[], None], s: _Static, steps: int, *records: Tensor) -> list[Tensor]:
    """Chunks replayed until every sentence has ended or `steps` are done: each record's copies, (rows, steps)."""
    copies: list[list[Tensor]] = [[] for _ in records]
    for _ in range(math.ceil(steps / STEPS_PER_GRAPH)):
        replay()
        for kept, record in zip(copies, records, strict=True):
            kept.append(record.clone())
        if not bool(s.going.any()):
            break
    return [torch.cat(kept, 1)[:, :steps] for kept in copies]


def _greedy_chunk(model: Decoding, min_len: int) -> Callable[[_GreedyStatic], None]:
    def chunk(s: _GreedyStatic) -> None:
        state, prev = s.state(), s.prev
        constants = _ChunkConstants.make(s, s.limits, model.vocab_size, min_len)
        for j in range(STEPS_PER_GRAPH):
            logits, state, _ = model.step(prev, state, s.memory)
            logp = constants.logp(logits, j)                              # (rows, vocab)
            # every row records its best token and log p; an ended row's are cut afterwards. (On CUDA a
            # reduction's two outputs must have the same strides: both records are (rows, steps).)
            _, prev = torch.max(logp, -1, out=(s.out_logp[:, j], s.out_tokens[:, j]))   # (rows,)
        s.going.logical_and_((s.out_tokens != EOS).all(1))
        s.step.add_(STEPS_PER_GRAPH)
        s.store_state(state)
        s.prev.copy_(prev)
    return chunk


def _allocate(cls: Any, memory: Memory, state: DecoderState, sentences: int, src_len: int, rows: int,
              device: torch.device | None, **extra: tuple[tuple[int, ...], torch.dtype]) -> Any:
    """`cls`'s tensors, zeros on `device` (default the memory's; "meta" sizes them without allocating): the
    memory padded to (sentences, src_len), the state to `rows`, `extra` given as (shape, dtype)."""
    device = device or memory.mask.device
    padded: dict[str, Any] = {f.name: None if (t := getattr(memory, f.name)) is None
                              else t.new_zeros(sentences, src_len, *t.shape[2:], device=device) for f in fields(Memory)}
    layers, _, hidden = state.hidden.shape
    like = lambda t, *shape: None if t is None else t.new_zeros(shape, device=device)  # noqa: E731
    shapes = dict(prev=((rows,), torch.long), limits=((sentences,), torch.long), step=((), torch.long),
                  out_tokens=((rows, STEPS_PER_GRAPH), torch.long), going=((sentences,), torch.bool), **extra)
    return cls(memory=Memory(**padded), hidden=like(state.hidden, layers, rows, hidden),
               cell=like(state.cell, layers, rows, hidden), feed=like(state.feed, rows, hidden),
               **{name: torch.zeros(shape, dtype=dtype, device=device) for name, (shape, dtype) in shapes.items()})


def _greedy_static(memory: Memory, state: DecoderState, rows: int, src_len: int,
                   device: torch.device | None) -> _GreedyStatic:
    return _allocate(_GreedyStatic, memory, state, rows, src_len, rows, device,
                     out_logp=((rows, STEPS_PER_GRAPH), torch.float32))


def _beam_static(memory: Memory, state: DecoderState, sentences: int, src_len: int, k: int, n_best: int,
                 device: torch.device | None) -> _BeamStatic:
    rows, steps, f32 = sentences * k, STEPS_PER_GRAPH, torch.float32
    return _allocate(_BeamStatic, memory, state, sentences, src_len, rows, device, scores=((rows,), f32),
                     out_parents=((rows, steps), torch.long), out_fin=((sentences, steps, k), f32),
                     out_fin_rows=((sentences, steps, 2 * k), torch.long), kept=((sentences, n_best), f32),
                     top_ended=((sentences,), torch.bool))


def _beam_chunk(model: Decoding, settings: SearchSettings, sentences: int,
                device: torch.device) -> Callable[[_BeamStatic], None]:
    k, n_best, alpha = settings.beam_size, min(settings.n_best, settings.beam_size), settings.alpha

    def chunk(s: _BeamStatic) -> None:
        state, prev, alive = s.state(), s.prev, s.scores
        # made inside the graph: a tensor from outside must outlive it, this call's would not
        base = (torch.arange(sentences, device=device) * k).unsqueeze(1)  # (sentences, 1)
        row_limits = s.limits.unsqueeze(1).expand(-1, k).reshape(-1)     # (rows,)
        lp_limit = length_penalty(s.limits.float(), alpha)               # (sentences,)
        constants = _ChunkConstants.make(s, row_limits, model.vocab_size, settings.min_len)
        penalties = length_penalty(constants.positions.float() + 1, alpha)   # (STEPS_PER_GRAPH,)
        for j in range(STEPS_PER_GRAPH):
            logits, state, _ = model.step(prev, state, s.memory)
            logp = constants.logp(logits, j)                               # (rows, vocab)
            step = beam_step(logp, alive, base, k, penalties[j], constants.neg_inf,
                             out_rows=s.out_fin_rows[:, j], out_finished=s.out_fin[:, j])
            # the continuing beams' tokens and parent rows, gathered straight into this step's records
            prev = torch.gather(step.tokens, 1, step.pick, out=s.out_tokens[:, j].view(sentences, k)).view(-1)
            parents = torch.gather(step.rows, 1, step.pick, out=s.out_parents[:, j].view(sentences, k)).view(-1)
            state = state.index_select(parents)
            # A done sentence's beams decode on unmasked, the stop test once per chunk; early_stop ends
            # sentences that could still gain: every step, masked.
            if settings.early_stop:
                _keep_best(s.kept, step.finished)
                s.top_ended.logical_or_(step.top_ended())
                s.going.logical_and_(~sentence_done(s.kept[:, n_best - 1], step.alive[:, 0], lp_limit, s.top_ended))
                alive = torch.where(s.going.unsqueeze(1), step.alive, constants.neg_inf).view(-1)
            else:
                alive = step.alive.view(-1)
        if not settings.early_stop:
            _keep_best(s.kept, s.out_fin.view(sentences, -1))
            s.going.logical_and_(~sentence_done(s.kept[:, n_best - 1], step.alive[:, 0], lp_limit, None))
        s.step.add_(STEPS_PER_GRAPH)
        s.store_state(state)
        s.prev.copy_(prev)
        s.scores.copy_(alive)
    return chunk


def _keep_best(kept: Tensor, finished: Tensor) -> None:
    """kept: (sentences, n) best finished scores, best first, updated in place with finished (sentences, m)."""
    if kept.size(1) == 1:
        torch.maximum(kept, finished.amax(1, keepdim=True), out=kept)
    else:
        kept.copy_(torch.cat([kept, finished], 1).topk(kept.size(1), dim=1).values)


def _backtrack(tokens: Tensor, parents: Tensor, fin_step: Tensor, fin_row: Tensor, steps: int) -> Tensor:
    """The finished hypotheses' tokens, EOS included, PAD after: (batch, beam, steps). tokens, parents: (rows,
    recorded steps), the token row r holds after step t and the row it came from; a hypothesis that finished
    at step s from row r is row r's tokens after step s-1, then EOS. fin_step, fin_row: (batch, beam)."""
    tok, par = tokens.cpu().numpy(), parents.cpu().numpy()
    end, row = fin_step.cpu().numpy(), fin_row.cpu().numpy()
    out = np.full((*end.shape, steps), PAD, dtype=np.int64)
    np.put_along_axis(out, end[..., None], EOS, axis=2)
    current = row.copy()                                        # the row holding position t of each hypothesis
    for t in range(int(end.max(initial=0)) - 1, -1, -1):
        inside = end > t                                        # hypotheses with a token at position t
        out[..., t] = np.where(inside, tok[current, t], out[..., t])
        current = np.where(inside, par[current, t], current)
    return torch.from_numpy(out)

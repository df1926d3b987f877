"""Greedy and beam search on a GPU with the decoder's steps replayed as captured CUDA graphs.

At the reference model's size a decoder step is a few dozen kernels of a few microseconds each;
launched one by one from Python, the GPU spends most of a step waiting for the next launch. Here
`STEPS_PER_GRAPH` consecutive steps are captured once per shape as one CUDA graph and replayed:
one launch per chunk of steps, and one host synchronisation per chunk to see whether every
sentence has ended.

A graph needs static shapes and no host synchronisation inside, so the searches here differ from
nmt.decode.search in how they keep their books, not in what they compute:
  * the batch is padded to a row bucket and a source-length bucket (`bucket_size`), so that a few graphs
    serve every batch; padded rows start ended, padded source positions are masked;
  * rows whose search is over are never dropped: greedy rows decode on and what follows their first
    EOS is cut afterwards; a beam search sentence that is done decodes on unmasked, as nothing it finishes
    later can rank among its n best (with early_stop, which ends sentences that could still gain, masked);
  * each step only records (greedy: token and log p; beam: the alive beams' tokens and parent rows, the
    finishing candidates' scores and rows), and the hypotheses are put together once, after the last
    step: a step's operations are its kernels, so everything that can wait for the end does;
  * beam search's first step runs all `beam` rows with every beam but the first at log p = -inf, which
    selects exactly what one row would.
Their outputs equal the eager searches' (`tests/test_cuda.py`), up to the last bits that another
batch shape may change in a matrix product.

Only the plain searches are graphed: sampling, prefixes, n-gram blocking, coverage, attention
output, shortlists and ensembles take the eager path (`graphable`).
"""

from __future__ import annotations

import functools
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from nmt.data.batching import bucket_size
from nmt.data.tokenizer import BOS, EOS, PAD
from nmt.decode.search import MIN_LEN, NEG_INF, Hypothesis, _collect, _collect_beams, length_penalty, max_output_lengths
from nmt.decode.steps import Decoding
from nmt.device import active_autocast_dtype, capturing
from nmt.model.attention import Memory
from nmt.model.decoder import DecoderState

STEPS_PER_GRAPH = 8        # steps per replay: fewer host syncs against up to 7 steps decoded past the end
# shapes kept (the least recently used dropped first), so that a server's GPU memory stays bounded: at most
MAX_GRAPHS = 48            # shapes,
GRAPH_MEMORY_SHARE = 0.25  # and this share of the GPU's memory in their static tensors


def static_shape(sentences: int, src_len: int) -> tuple[int, int]:
    """The (sentences, source length) a batch is padded to: its graph's shape (`bucket_size`, steps of 8)."""
    return bucket_size(sentences, 8), bucket_size(src_len, 8)


def graphable(model: object, device: torch.device, *, sampling: bool, prefix: object, no_repeat_ngram: int,
              coverage: float, return_attention: bool) -> bool:
    """Whether a search with these options can run as captured graphs (one model, no shortlist in use)."""
    return (device.type == "cuda" and isinstance(model, Decoding) and model.plain and not sampling
            and prefix is None and not no_repeat_ngram and not coverage and not return_attention)


@dataclass
class _Static:
    """The tensors a captured graph reads and writes: their addresses are fixed at capture."""

    memory: Memory              # (rows or sentences, src_len, ...) padded copies of the batch's memory
    hidden: Tensor              # (layers, rows, dec_hidden)
    cell: Tensor | None         # (layers, rows, dec_hidden), LSTM
    feed: Tensor | None         # (rows, dec_hidden), Luong input feeding
    prev: Tensor                # (rows,) the previous output token
    limits: Tensor              # (sentences,) output length limits, EOS included
    step: Tensor                # () the output position t of the chunk's next step
    out_tokens: Tensor          # (rows, STEPS_PER_GRAPH) each step's token
    going: Tensor               # greedy: (rows,) not ended; beam: (sentences,) still searching
    out_logp: Tensor | None = None     # greedy: (rows, STEPS_PER_GRAPH) each step's log p
    scores: Tensor | None = None       # beam: (rows,) alive log p
    out_parents: Tensor | None = None  # beam: (rows, STEPS_PER_GRAPH) each step's parent row
    out_fin: Tensor | None = None      # beam: (sentences, STEPS_PER_GRAPH, beam) normalised scores of the
    #                                    step's finishing candidates, -inf for the others
    out_fin_rows: Tensor | None = None  # beam: (sentences, STEPS_PER_GRAPH, 2 beam) the alive rows the step's
    #                                     candidates come from (the first `beam` can finish)
    kept: Tensor | None = None         # beam: (sentences, n_best) the best finished scores so far
    top_ended: Tensor | None = None    # beam, early_stop: (sentences,) a best candidate ended

    def state(self) -> DecoderState:
        return DecoderState(self.hidden, self.cell, self.feed)

    def nbytes(self) -> int:
        """What the static tensors hold (most of it the padded memory: sentences x src_len x features)."""
        tensors = [getattr(self, f.name) for f in fields(self) if f.name != "memory"]
        tensors += [getattr(self.memory, f.name) for f in fields(Memory)]
        return sum(t.nbytes for t in tensors if t is not None)

    def store_state(self, state: DecoderState) -> None:
        self.hidden.copy_(state.hidden)
        if self.cell is not None:
            self.cell.copy_(state.cell)
        if self.feed is not None:
            self.feed.copy_(state.feed)

    @classmethod
    def allocate(cls, memory: Memory, state: DecoderState, sentences: int, src_len: int, beam: int = 0,
                 n_best: int = 1, device: torch.device | None = None) -> _Static:
        """Zeros for `sentences` padded to `src_len`, with `beam` rows each (0: greedy search, one row), on
        `device` (default the memory's; "meta" sizes them without allocating). A capture's warm-up runs on
        them (a zero padding bias: a finite softmax); `load` puts a batch in."""
        rows, device = sentences * max(beam, 1), device or memory.mask.device
        padded = {f.name: None if (t := getattr(memory, f.name)) is None
                  else t.new_zeros(sentences, src_len, *t.shape[2:], device=device) for f in fields(Memory)}
        layers, _, hidden = state.hidden.shape
        zeros = lambda t, *shape: None if t is None else t.new_zeros(shape, device=device)  # noqa: E731
        whole = lambda *shape, dtype=torch.long: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
        static = cls(Memory(**padded), zeros(state.hidden, layers, rows, hidden),
                     zeros(state.cell, layers, rows, hidden), zeros(state.feed, rows, hidden),
                     prev=whole(rows), limits=whole(sentences), step=whole(),
                     out_tokens=whole(rows, STEPS_PER_GRAPH), going=whole(sentences, dtype=torch.bool))
        if beam:
            static.scores = whole(rows, dtype=torch.float32)
            static.out_parents, static.top_ended = whole(rows, STEPS_PER_GRAPH), whole(sentences, dtype=torch.bool)
            static.out_fin = whole(sentences, STEPS_PER_GRAPH, beam, dtype=torch.float32)
            static.out_fin_rows = whole(sentences, STEPS_PER_GRAPH, 2 * beam)
            static.kept = whole(sentences, n_best, dtype=torch.float32)
        else:
            static.out_logp = whole(rows, STEPS_PER_GRAPH, dtype=torch.float32)
        return static

    def load(self, memory: Memory, state: DecoderState, limits: Tensor) -> None:
        """A batch in: its memory and start state (the padding zeroed) and output limits; the counters reset,
        the padded sentences ended before they start."""
        batch = limits.size(0)
        for f in fields(Memory):
            target, value = getattr(self.memory, f.name), getattr(memory, f.name)
            if target is not None:
                target.fill_(NEG_INF if f.name == "pad_bias" else 0)
                target[: value.size(0), : value.size(1)] = value
        self.memory.mask[batch:, 0] = True          # a padded sentence attends to one zero position: a finite softmax
        self.memory.pad_bias[batch:, 0] = 0.0
        for target, value in ((self.hidden, state.hidden), (self.cell, state.cell)):
            if target is not None:
                target.zero_()
                target[:, : value.size(1)] = value
        if self.feed is not None:
            self.feed.zero_()
            self.feed[: state.feed.size(0)] = state.feed
        for counter in (self.prev, self.step, self.scores, self.going, self.top_ended):
            if counter is not None:
                counter.zero_()
        self.prev.fill_(BOS)
        self.limits.fill_(1)
        self.limits[:batch] = limits
        self.going[:batch] = True
        if self.kept is not None:
            self.kept.fill_(NEG_INF)


@dataclass
class _ChunkConstants:
    """What every step of a chunk reads and no step changes, made once per chunk inside the graph (a
    tensor made outside would have to outlive the graph, and one from a Python list is a copy from the
    host, which a capture does not allow). A step's operations are its kernels: each one kept out of
    the step loop is STEPS_PER_GRAPH fewer."""

    positions: Tensor       # (STEPS_PER_GRAPH,) the output position t of each step
    at_limit: Tensor        # (rows, STEPS_PER_GRAPH) whether step j is the row's last allowed position (or past it)
    eos_banned: Tensor      # (rows, STEPS_PER_GRAPH) no EOS at step j: before min_len, unless at the limit
    banned: Tensor          # (2,) PAD and BOS, never produced
    not_eos: Tensor         # (vocab,) True but at EOS
    neg_inf: Tensor         # () what `torch.where` fills in (a Python number: a new tensor, a kernel, per call)

    @classmethod
    def make(cls, s: _Static, row_limits: Tensor, vocab: int, min_len: int) -> _ChunkConstants:
        device = row_limits.device
        banned = torch.full((2,), PAD, device=device)
        banned[1:].fill_(BOS)           # a kernel: `banned[1] = BOS` copies a host scalar, which a capture refuses
        positions = s.step + torch.arange(STEPS_PER_GRAPH, device=device)
        at_limit = (row_limits - 1).unsqueeze(1) <= positions
        return cls(positions=positions, at_limit=at_limit, eos_banned=(positions < min_len) & ~at_limit,
                   banned=banned, not_eos=torch.arange(vocab, device=device) != EOS,
                   neg_inf=torch.full((), NEG_INF, dtype=torch.float32, device=device))


def _constrain_static(logp: Tensor, j: int, min_len: int, c: _ChunkConstants) -> None:
    """nmt.decode.search._constrain for the chunk's step j, whose position is on the device. In place;
    logp: (rows, vocab)."""
    logp.index_fill_(1, c.banned, NEG_INF)
    if min_len:                                                              # one kernel, in place
        logp[:, EOS].masked_fill_(c.eos_banned[:, j], NEG_INF)
    logp.masked_fill_(c.at_limit[:, j].unsqueeze(1) & c.not_eos, NEG_INF)


def _on_model_device(search: Callable) -> Callable:
    """A search with the model's GPU current: cuda:N's warm-ups, captures and replays happen on N."""
    @functools.wraps(search)
    def run(self: SearchGraphs, *args, **kwargs):
        with torch.cuda.device(self.model.device) if self.capture else nullcontext():
            return search(self, *args, **kwargs)
    return run


class SearchGraphs:
    """Captured greedy and beam search chunks for one model, by shape and options.

    Belongs to one Translator, which runs one search at a time. The graphs read the derived weights of
    the model's inference context where they were when captured: that context (which keeps them) and the
    model must not change while it lives. All graphs share one memory pool: whatever a graph
    computes inside is scratch, and its results are copied out of the static tensors before another
    graph runs.
    """

    def __init__(self, model: Decoding, capture: bool = True, max_bytes: float | None = None) -> None:
        """`capture=False` runs the same static-shape chunks eagerly (the CPU, tests): no graphs. `max_bytes`:
        what the kept shapes' static tensors may hold (default: GRAPH_MEMORY_SHARE of the GPU's memory; none
        without capture); a new shape drops the least recently used ones until it fits, or is the only one."""
        self.model, self.capture = model, capture
        self.pool = None                    # the graphs' memory pool, made for the first shape kept
        self.stream = torch.cuda.Stream(device=model.device) if capture else None     # captures go here
        if max_bytes is None:
            max_bytes = (GRAPH_MEMORY_SHARE * torch.cuda.get_device_properties(model.device).total_memory
                         if capture else math.inf)
        self.max_bytes = max_bytes
        self.graphs: OrderedDict[tuple, tuple[Callable[[], None], _Static]] = OrderedDict()   # oldest use first
        # what capturing has cost so far (a new shape's warm-up run, then its capture and instantiation)
        self.captured, self.warmup_seconds, self.capture_seconds = 0, 0.0, 0.0

    def _graph(self, key: tuple, build: Callable[[torch.device | None], _Static], chunk: Callable[[_Static], None]
               ) -> tuple[Callable[[], None], _Static]:
        """The replay function and static tensors of the chunk for `key`, captured on first use. `build(device)`
        allocates the static tensors (on the model's device for None); sized first on "meta", so that the
        shapes that make room go before the new one takes its memory."""
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
        """What the kept shapes' static tensors hold, counted against `max_bytes`."""
        return sum(static.nbytes() for _, static in self.graphs.values())

    def close(self) -> None:
        """Drop the graphs."""
        self.graphs.clear()

    # ------------------------------------------------------------------ greedy

    @_on_model_device
    @torch.no_grad()
    def greedy(self, src: Tensor, src_lengths: Tensor, max_len_ratio: float = 2.0, min_len: int = MIN_LEN,
               max_len: int | None = None) -> list[Hypothesis]:
        """nmt.decode.search.greedy_search, graphed."""
        model = self.model
        memory, state = model.encode(src, src_lengths, fold_context=False)
        batch, src_len = src.shape
        rows, padded_len = static_shape(batch, src_len)
        limits = max_output_lengths(src_lengths, max_len_ratio, min_len, max_len).to(src.device)
        steps = int(limits.max())

        def chunk(s: _Static) -> None:
            state, prev = s.state(), s.prev
            constants = _ChunkConstants.make(s, s.limits, model.vocab_size, min_len)
            for j in range(STEPS_PER_GRAPH):
                logits, state, _ = model.step(prev, state, s.memory)
                logp = logits.log_softmax(-1, dtype=torch.float32)           # (rows, vocab)
                _constrain_static(logp, j, min_len, constants)
                # every row records its best token and log p; an ended row's are cut afterwards. (On CUDA
                # a reduction's two outputs must have the same strides: both records are (rows, steps).)
                _, prev = torch.max(logp, -1, out=(s.out_logp[:, j], s.out_tokens[:, j]))   # (rows,)
            s.going.logical_and_((s.out_tokens != EOS).all(1))
            s.step.add_(STEPS_PER_GRAPH)
            s.store_state(state)
            s.prev.copy_(prev)

        replay, s = self._graph(("greedy", rows, padded_len, min_len),
                                lambda device: _Static.allocate(memory, state, rows, padded_len, device=device),
                                chunk)
        s.load(memory, state, limits)
        chunks, logps = [], []
        for _ in range(math.ceil(steps / STEPS_PER_GRAPH)):
            replay()
            chunks.append(s.out_tokens[:batch].clone())
            logps.append(s.out_logp[:batch].clone())
            if not bool(s.going.any()):
                break
        tokens = torch.cat(chunks, 1)[:, :steps]                           # (batch, steps)
        # a row's output ends at its first EOS, which every row reaches by its limit (at most `steps`)
        ends = tokens == EOS
        lengths = torch.where(ends.any(1), ends.int().argmax(1) + 1, tokens.size(1))     # (batch,) EOS included
        after = torch.arange(tokens.size(1), device=tokens.device) >= lengths.unsqueeze(1)
        logp = torch.cat(logps, 1)[:, :steps].masked_fill(after, 0.0).cpu().numpy()
        # summed step by step in float32 (a running sum, as eager search's): the same score to the last bit
        scores = torch.from_numpy(np.cumsum(logp, axis=1, dtype=np.float32)[:, -1])
        return _collect(tokens.masked_fill(after, PAD), lengths, scores, None, src_lengths)

    # ------------------------------------------------------------------ beam

    @_on_model_device
    @torch.no_grad()
    def beam(self, src: Tensor, src_lengths: Tensor, beam_size: int = 5, alpha: float = 1.0,
             max_len_ratio: float = 2.0, min_len: int = MIN_LEN, n_best: int = 1, max_len: int | None = None,
             early_stop: bool = False) -> list[list[Hypothesis]]:
        """nmt.decode.search.beam_search, graphed (see the module's docstring for the bookkeeping)."""
        model, k = self.model, beam_size
        n_best = min(n_best, k)
        memory, state = model.encode(src, src_lengths)
        batch, src_len = src.shape
        sentences, padded_len = static_shape(batch, src_len)
        limits = max_output_lengths(src_lengths, max_len_ratio, min_len, max_len).to(src.device)
        steps = int(limits.max())
        device = src.device
        state = state.index_select(torch.arange(batch * k, device=device) // k)    # k rows per sentence

        def chunk(s: _Static) -> None:
            state, prev, alive = s.state(), s.prev, s.scores
            # made inside the graph: a tensor from outside must outlive it, this call's would not
            base = (torch.arange(sentences, device=device) * k).unsqueeze(1)  # (sentences, 1)
            row_limits = s.limits.unsqueeze(1).expand(-1, k).reshape(-1)     # (rows,)
            lp_limit = length_penalty(s.limits.float(), alpha)               # (sentences,)
            vocab = model.vocab_size
            constants = _ChunkConstants.make(s, row_limits, vocab, min_len)
            penalties = length_penalty(constants.positions.float() + 1, alpha)   # (STEPS_PER_GRAPH,)
            for j in range(STEPS_PER_GRAPH):
                logits, state, _ = model.step(prev, state, s.memory)
                logp = logits.log_softmax(-1, dtype=torch.float32)            # (rows, vocab)
                _constrain_static(logp, j, min_len, constants)
                candidates = logp.add_(alive.unsqueeze(1)).view(sentences, k * vocab)
                top_scores, top_ids = candidates.topk(2 * k, dim=1)            # (sentences, 2k)
                top_beam, top_token = top_ids // vocab, top_ids % vocab
                ends = top_token == EOS
                source_rows = torch.add(base, top_beam, out=s.out_fin_rows[:, j])     # (sentences, 2k)
                # 1. EOS candidates ranked within the top k finish: recorded with their normalised scores
                #    (a dead beam's candidate scores -inf, and -inf / penalty stays -inf: it never finishes).
                new_fin = torch.where(ends[:, :k], top_scores[:, :k] / penalties[j], constants.neg_inf,
                                      out=s.out_fin[:, j])                    # (sentences, k)
                # 2. The best k candidates that do not end continue: their tokens and parent rows are
                #    gathered straight into this step's records.
                alive_best, alive_pick = top_scores.masked_fill(ends, NEG_INF).topk(k, dim=1)
                prev = torch.gather(top_token, 1, alive_pick, out=s.out_tokens[:, j].view(sentences, k)).view(-1)
                parents = torch.gather(source_rows, 1, alive_pick,
                                       out=s.out_parents[:, j].view(sentences, k)).view(-1)   # (rows,)
                state = state.index_select(parents)
                # 3. A sentence goes on while its best alive beam can beat its n_best-th finished; with
                #    none alive, -inf / penalty = -inf, and with none finished, -inf wins nothing. Once it
                #    cannot, nothing its beams finish later ranks above that n_best-th (the bound of
                #    nmt.decode.search): they decode on unmasked, and the rule is checked once per chunk,
                #    for the host to stop. early_stop ends sentences that could still gain: every step.
                if early_stop:
                    _keep_best(s.kept, new_fin)
                    last_kept = s.kept[:, n_best - 1]
                    s.top_ended.logical_or_(ends[:, 0] & (top_scores[:, 0] > NEG_INF))
                    s.going.logical_and_((last_kept < alive_best[:, 0] / lp_limit)
                                         & ~(s.top_ended & (last_kept > NEG_INF)))
                    alive = torch.where(s.going.unsqueeze(1), alive_best, constants.neg_inf).view(-1)
                else:
                    alive = alive_best.view(-1)
            if not early_stop:
                _keep_best(s.kept, s.out_fin.view(sentences, -1))
                s.going.logical_and_(s.kept[:, n_best - 1] < alive_best[:, 0] / lp_limit)
            s.step.add_(STEPS_PER_GRAPH)
            s.store_state(state)
            s.prev.copy_(prev)
            s.scores.copy_(alive)

        replay, s = self._graph(("beam", sentences, padded_len, k, alpha, min_len, n_best, early_stop),
                                lambda device: _Static.allocate(memory, state, sentences, padded_len, k, n_best,
                                                                device), chunk)
        s.load(memory, state, limits)
        alive = s.scores.view(sentences, k)
        alive[:, 1:] = NEG_INF                                               # one live beam per sentence
        alive[batch:] = NEG_INF                                              # none for the padded ones
        tokens, parents, fin, fin_rows = [], [], [], []
        for _ in range(math.ceil(steps / STEPS_PER_GRAPH)):
            replay()
            tokens.append(s.out_tokens.clone())
            parents.append(s.out_parents.clone())
            fin.append(s.out_fin[:batch].clone())
            fin_rows.append(s.out_fin_rows[:batch, :, :k].clone())
            if not bool(s.going.any()):
                break
        # the best k finished over all steps, as eager search's pool keeps them (none finishes past `steps`);
        # of equal scores, the one that finished first
        ranked, order = torch.cat(fin, 1)[:, :steps].reshape(batch, -1).sort(dim=1, descending=True, stable=True)
        fin_scores, pick = ranked[:, :k], order[:, :k]                                     # (batch, k)
        fin_step = pick // k
        fin_row = torch.cat(fin_rows, 1)[:, :steps].reshape(batch, -1).gather(1, pick)
        fin = _backtrack(torch.cat(tokens, 1), torch.cat(parents, 1), fin_step, fin_row, steps)
        fin_lengths = (fin_step + 1).masked_fill(fin_scores == NEG_INF, 0)
        fin_logp = fin_scores * length_penalty(fin_lengths.float(), alpha)
        return _collect_beams(fin, fin_lengths, fin_scores, fin_logp, None, src_lengths, n_best)


def _keep_best(kept: Tensor, finished: Tensor) -> None:
    """kept: (sentences, n) the n best finished scores so far, best first, updated in place with
    finished: (sentences, m) new ones (-inf: none)."""
    if kept.size(1) == 1:
        torch.maximum(kept, finished.amax(1, keepdim=True), out=kept)
    else:
        kept.copy_(torch.cat([kept, finished], 1).topk(kept.size(1), dim=1).values)


def _backtrack(tokens: Tensor, parents: Tensor, fin_step: Tensor, fin_row: Tensor, steps: int) -> Tensor:
    """The finished hypotheses' tokens from the per-step records, EOS included, PAD after it.

    tokens, parents: (rows, recorded steps): the token alive row r holds after step t, and the row it came
    from. A hypothesis that finished at step s from alive row r holds the tokens of row r after step s-1,
    then EOS. fin_step, fin_row: (batch, beam). Returns (batch, beam, steps). Walks back over the steps on
    the host (one vectorised pass per step over all hypotheses), after one copy of the records.
    Every fin_step is below `steps`, filled slots' and empty ones' (score -inf, never read) alike.
    """
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

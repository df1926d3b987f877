"""The static-shape searches of nmt.decode.graphs, run eagerly on the CPU (capture=False): the same
hypotheses and scores as the eager searches of nmt.decode.search. tests/test_cuda.py runs them captured."""

import contextlib
import types
from dataclasses import replace

import pytest
import torch

from nmt.data.batching import bucket_size
from nmt.decode import graphs as graphs_module
from nmt.decode.graphs import STEPS_PER_GRAPH, SearchGraphs, _Static
from nmt.decode.search import Sampler, SearchSettings, beam_search, greedy_search, search
from nmt.decode.steps import Decoding

from .test_search import VARIANTS, random_model, source_batch


def assert_same(expected, found):
    assert [h.tokens for h in expected] == [h.tokens for h in found]
    assert torch.allclose(torch.tensor([h.score for h in expected]), torch.tensor([h.score for h in found]), atol=1e-5)
    assert torch.allclose(torch.tensor([h.log_prob for h in expected]), torch.tensor([h.log_prob for h in found]),
                          atol=1e-5)


@pytest.mark.parametrize("attention", VARIANTS)
@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_static_greedy_equals_greedy(attention, rnn):
    model = random_model(attention, rnn)
    src, lengths = source_batch()
    graphs = SearchGraphs(Decoding(model), capture=False)
    for ratio, min_len, cap in [(1.5, 0, None), (3.0, 4, None), (2.0, 0, 3)]:
        expected = greedy_search(model, src, lengths, SearchSettings(max_len_ratio=ratio, min_len=min_len, max_len=cap))
        assert_same(expected, graphs.greedy(src, lengths,
                                            SearchSettings(max_len_ratio=ratio, min_len=min_len, max_len=cap)))


@pytest.mark.parametrize("attention", VARIANTS)
@pytest.mark.parametrize(("beam", "alpha", "n_best", "early_stop"),
                         [(5, 1.0, 1, False), (3, 0.0, 3, False), (4, 0.6, 2, True), (1, 0.0, 1, False)])
def test_static_beam_equals_beam(attention, beam, alpha, n_best, early_stop):
    model = random_model(attention, "gru" if attention != "luong_concat" else "lstm")
    src, lengths = source_batch()
    graphs = SearchGraphs(Decoding(model), capture=False)
    expected = beam_search(model, src, lengths,
                           SearchSettings(beam_size=beam, alpha=alpha, n_best=n_best, max_len_ratio=2.5,
                                          early_stop=early_stop))
    found = graphs.beam(src, lengths,
                        SearchSettings(beam_size=beam, alpha=alpha, max_len_ratio=2.5, n_best=n_best,
                                       early_stop=early_stop))
    assert len(found) == len(expected) == src.size(0)
    for e, f in zip(expected, found, strict=True):
        assert len(e) == len(f) == n_best
        assert_same(e, f)


@pytest.mark.parametrize("n_best", [1, 2])
def test_a_sentence_that_is_done_decodes_on_without_changing_its_n_best(n_best):
    """Without early_stop a sentence whose n best can no longer change is not masked: its beams decode on
    with the others' and finish more hypotheses, which must not reach its n best. This model ends some
    sentences' searches chunks before the batch's last (their outputs short, others' at the limit)."""
    model = random_model("bahdanau", seed=1, sharpen=0.5)
    src, lengths = source_batch()
    expected = beam_search(model, src, lengths,
                           SearchSettings(beam_size=4, alpha=1.0, n_best=n_best, max_len_ratio=3.5))
    found = SearchGraphs(Decoding(model), capture=False).beam(src, lengths,
                                                               SearchSettings(beam_size=4, alpha=1.0,
                                                                              max_len_ratio=3.5, n_best=n_best))
    for e, f in zip(expected, found, strict=True):
        assert_same(e, f)
    best = [len(hyps[0].tokens) for hyps in found]
    assert max(best) - min(best) > 2 * STEPS_PER_GRAPH


def test_min_len_and_length_cap_in_beam():
    model = random_model("bahdanau")
    src, lengths = source_batch()
    graphs = SearchGraphs(Decoding(model), capture=False)
    found = graphs.beam(src, lengths, SearchSettings(beam_size=3, alpha=1.0, max_len_ratio=2.0, min_len=4, max_len=6))
    expected = beam_search(model, src, lengths,
                           SearchSettings(beam_size=3, alpha=1.0, max_len_ratio=2.0, min_len=4, max_len=6))
    for e, f in zip(expected, found, strict=True):
        assert_same(e, f)
        assert 4 <= len(f[0].tokens) <= 5


@pytest.mark.parametrize("cap", [1, 2])
def test_a_cap_shorter_than_a_chunk_in_beam(cap):
    """The search decodes on to the end of its chunk of steps, past the cap: nothing it records there may
    reach the hypotheses."""
    model = random_model("bahdanau")
    src, lengths = source_batch()
    graphs = SearchGraphs(Decoding(model), capture=False)
    found = graphs.beam(src, lengths, SearchSettings(beam_size=5, alpha=1.0, max_len_ratio=2.0, n_best=3, max_len=cap))
    expected = beam_search(model, src, lengths,
                           SearchSettings(beam_size=5, alpha=1.0, max_len_ratio=2.0, n_best=3, max_len=cap))
    for e, f in zip(expected, found, strict=True):
        assert_same(e, f)
        assert all(len(h.tokens) < cap for h in f)


def test_a_shape_is_built_once_and_serves_smaller_batches():
    """Batches that fall into one bucket reuse one set of static tensors; the padding changes nothing."""
    model = random_model("luong_general")
    src, lengths = source_batch()
    graphs = SearchGraphs(Decoding(model), capture=False)
    graphs.greedy(src, lengths)
    graphs.greedy(src[1:], lengths[1:])                             # 4 sentences, 9 columns: the same bucket
    assert len(graphs.graphs) == 1
    assert_same(greedy_search(model, src[1:], lengths[1:]), graphs.greedy(src[1:], lengths[1:]))


def test_long_outputs_span_several_chunks():
    model = random_model("bahdanau", sharpen=0.0)                  # flat distributions: no early EOS
    src, lengths = source_batch()
    graphs = SearchGraphs(Decoding(model), capture=False)
    found = graphs.greedy(src, lengths, SearchSettings(max_len_ratio=4.0))
    assert max(len(h.tokens) for h in found) > 2 * STEPS_PER_GRAPH
    assert_same(greedy_search(model, src, lengths, SearchSettings(max_len_ratio=4.0)), found)


@pytest.mark.parametrize(("n", "bucket"), [(1, 8), (8, 8), (9, 16), (64, 64), (65, 80), (81, 96), (129, 160),
                                           (1000, 1024)])
def test_buckets_waste_at_most_a_quarter(n, bucket):
    assert bucket_size(n, 8) == bucket
    assert bucket_size(n, 8) >= n and (bucket_size(n, 8) <= 1.25 * n or n <= 64)


def test_the_schedule_fills_a_tensor_lr_in_place():
    """A capturable optimiser keeps its lr in a tensor that a captured step reads: the schedule must fill it."""
    from nmt.config import TrainingConfig
    from nmt.train.schedules import LrSchedule

    parameter = torch.nn.Parameter(torch.zeros(3))
    lr = torch.tensor(1e-3)
    optimizer = torch.optim.Adam([parameter], lr=lr)
    schedule = LrSchedule(optimizer, TrainingConfig(lr=1e-3, lr_schedule="inverse_sqrt", warmup_updates=10))
    schedule.step(5)
    assert optimizer.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(5e-4)


def test_checkpoints_store_plain_learning_rates():
    from nmt.train.checkpoint import _portable

    state = {"state": {}, "param_groups": [{"lr": torch.tensor(2e-3), "params": [0]}]}
    portable = _portable(state)
    assert portable["param_groups"][0]["lr"] == pytest.approx(2e-3)
    assert isinstance(portable["param_groups"][0]["lr"], float)
    assert isinstance(state["param_groups"][0]["lr"], torch.Tensor)      # the optimiser's own state untouched


def test_the_least_recently_used_shapes_are_dropped(monkeypatch):
    """A long-running server meets many batch shapes: only MAX_GRAPHS of them are kept."""
    from nmt.decode import graphs as graphed

    monkeypatch.setattr(graphed, "MAX_GRAPHS", 2)
    model = random_model("bahdanau")
    src, lengths = source_batch()
    graphs = SearchGraphs(Decoding(model), capture=False)
    graphs.greedy(src, lengths)                                   # rows 8, length 16
    graphs.greedy(src[:, :7][2:], lengths[2:])                    # length 8
    graphs.greedy(src, lengths)                                   # used again: now the most recent
    graphs.beam(src, lengths, SearchSettings(beam_size=2))        # a third shape: drops the length-8 one
    assert [key[:3] for key in graphs.graphs] == [("greedy", 8, 16), ("beam", 8, 16)]
    assert_same(greedy_search(model, src[:, :7][2:], lengths[2:]), graphs.greedy(src[:, :7][2:], lengths[2:]))


def test_the_kept_shapes_stay_within_their_memory_budget(monkeypatch):
    """The static tensors of a shape grow with sentences x source length: a new shape also drops the least
    recently used ones until all fit in `max_bytes` (a share of the GPU's memory), whatever their number,
    and before it takes its own memory."""
    model = random_model("bahdanau")
    peaks: list[tuple[int, float]] = []                # (what the kept shapes and a new one hold, max_bytes)
    current: list[SearchGraphs] = []
    allocate = graphs_module._greedy_static

    def recorded(*args, **kwargs) -> _Static:
        static = allocate(*args, **kwargs)
        if static.prev.device.type != "meta" and current:
            peaks.append((current[-1].kept_bytes + static.nbytes(), current[-1].max_bytes))
        return static

    monkeypatch.setattr(graphs_module, "_greedy_static", recorded)
    src, lengths = source_batch()
    short = (src[:, :7][2:], lengths[2:])                                  # rows 8, length 8
    sizes = []
    for batch in ((src, lengths), short):
        alone = SearchGraphs(Decoding(model), capture=False)
        alone.greedy(*batch)
        sizes.append(alone.kept_bytes)
    assert sizes[0] > sizes[1] > 0
    both = SearchGraphs(Decoding(model), capture=False, max_bytes=sum(sizes))
    both.greedy(src, lengths)
    both.greedy(*short)
    assert [key[:3] for key in both.graphs] == [("greedy", 8, 16), ("greedy", 8, 8)]
    one = SearchGraphs(Decoding(model), capture=False, max_bytes=sum(sizes) - 1)
    current.append(one)
    one.greedy(src, lengths)
    one.greedy(*short)                                                    # does not fit beside the first
    assert [key[:3] for key in one.graphs] == [("greedy", 8, 8)] and one.kept_bytes == sizes[1]
    assert_same(greedy_search(model, src, lengths), one.greedy(src, lengths))    # built again: the same
    assert [key[:3] for key in one.graphs] == [("greedy", 8, 16)] and one.kept_bytes == sizes[0]
    assert len(peaks) == 3 and all(held <= budget for held, budget in peaks)     # never both at once
    tiny = SearchGraphs(Decoding(model), capture=False, max_bytes=1)   # a shape over the budget still runs alone
    assert_same(greedy_search(model, *short), tiny.greedy(*short))
    assert len(tiny.graphs) == 1


def test_a_shape_whose_capture_fails_is_neither_kept_nor_counted(monkeypatch):
    """Out of memory in a capture leaves the books as they were: a server's later shapes still fit."""
    model = random_model("bahdanau")
    src, lengths = source_batch()
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: None)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())

    def out_of_memory(device=None) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(torch.cuda, "synchronize", out_of_memory)        # right after the warm-up
    graphs = SearchGraphs(Decoding(model), capture=True, max_bytes=10**9)
    for _ in range(2):
        with pytest.raises(torch.OutOfMemoryError):
            graphs.greedy(src, lengths)
    assert not graphs.graphs and graphs.kept_bytes == 0 and graphs.captured == 0


def test_only_plain_searches_of_one_model_are_graphed():
    """`search` takes the graphs only for what they run: one model's plain searches on its whole vocabulary;
    sampling, prefixes, n-gram blocking, coverage, attention, shortlists and ensembles run eagerly."""
    model = Decoding(random_model("bahdanau"))
    graphs = SearchGraphs(model, capture=False)
    plain = SearchSettings(beam_size=1)
    assert graphs.runs(model, plain, None)
    assert not graphs.runs(model, plain, torch.zeros(1, 1))                      # a prefix
    for option in ({"sampler": Sampler()}, {"no_repeat_ngram": 2}, {"coverage": 0.2}, {"return_attention": True}):
        assert not graphs.runs(model, replace(plain, **option), None), option
    subset = model.with_output_subset(torch.arange(10))
    assert not graphs.runs(subset, plain, None)
    assert SearchGraphs.of(subset) is None and SearchGraphs.of(object()) is None   # an ensemble, say
    src, lengths = source_batch()
    search(model, src, lengths, replace(plain, return_attention=True), graphs=graphs)
    assert not graphs.graphs
    for settings in (plain, replace(plain, beam_size=3)):
        assert_same(greedy_search(model, src, lengths, plain) if settings.greedy else
                    [h[0] for h in beam_search(model, src, lengths, settings)],
                    [h[0] for h in search(model, src, lengths, settings, graphs=graphs)])
    assert [key[0] for key in graphs.graphs] == ["greedy", "beam"]


@pytest.mark.parametrize(("attention", "rnn", "greedy_budget", "beam_budget"),
                         [("bahdanau", "gru", 29, 42), ("luong_general", "gru", 27, 42),
                          ("luong_concat", "lstm", 31, 47)])
def test_a_captured_step_stays_within_its_kernel_budget(attention, rnn, greedy_budget, beam_budget):
    """On a GPU a captured step costs about one launch per ATen operation that does work (views are
    free). Counted with the bench's dispatch counter: a change that adds operations to the step loop fails
    here before it costs time on a GPU (bench/step_kernels.py gives the whole breakdown). Each budget is
    the count when written plus about two, for a torch release that dispatches an operation differently."""
    from bench.step_kernels import search_step

    model = random_model(attention, rnn)
    assert search_step(model, 1, sentences=5, src_len=9)["kernels_per_step"] <= greedy_budget
    assert search_step(model, 5, sentences=5, src_len=9)["kernels_per_step"] <= beam_budget


@pytest.mark.parametrize("attention", VARIANTS)
def test_static_searches_equal_eager_ones_under_bf16_autocast(attention):
    """The static state holds what an eager step makes of it under autocast (bf16 for every attention), so
    the chunks agree with eager search to float32 accuracy, not merely to bf16's. (Beam search in bf16 can
    still part ways at near-ties, where a padded batch's products round differently: greedy is the check.)"""
    model = random_model(attention, "gru" if attention != "luong_concat" else "lstm")
    src, lengths = source_batch()
    graphs = SearchGraphs(Decoding(model), capture=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert_same(greedy_search(model, src, lengths), graphs.greedy(src, lengths))
        if attention == "bahdanau":
            for e, f in zip(beam_search(model, src, lengths, SearchSettings(beam_size=4, alpha=1.0, n_best=2)),
                            graphs.beam(src, lengths,
                                        SearchSettings(beam_size=4, alpha=1.0, max_len_ratio=2.0, n_best=2)),
                                                       strict=True):
                assert_same(e, f)


def test_a_state_saved_without_graphs_keeps_a_graphed_optimiser_capturable():
    """Resuming (or --init-optimizer) from an eager run's state on a graphed run: the loaded groups would make
    the optimiser non-capturable, and the first captured update fail. Its own kind and lr tensor stay."""
    from nmt.config import Config
    from nmt.train.checkpoint import _portable, load_optimizer_state
    from nmt.train.graphed import capturable_optimizer

    eager_parameter, parameter = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    eager = torch.optim.Adam([eager_parameter], lr=1e-3)
    eager_parameter.grad = torch.ones(3)
    eager.step()
    saved = _portable(eager.state_dict())
    assert saved["param_groups"][0]["capturable"] is False
    graphed = capturable_optimizer(torch.optim.Adam, [parameter], 5e-4, torch.device("cpu"))
    lr = graphed.param_groups[0]["lr"]
    load_optimizer_state(graphed, saved, Config())
    group = graphed.param_groups[0]
    assert group["capturable"] is True and group["fused"] is True
    assert group["lr"] is lr and float(lr) == pytest.approx(1e-3)             # the saved rate, in its tensor
    step = graphed.state[parameter]["step"]
    assert step.dtype == torch.float32 and step.device == parameter.device and float(step) == 1
    assert torch.equal(graphed.state[parameter]["exp_avg"], eager.state[eager_parameter]["exp_avg"])
    assert saved["param_groups"][0]["capturable"] is False                    # the saved state untouched


def test_captures_use_the_models_stream_one_at_a_time_and_a_new_pool_once_no_graph_is_kept(monkeypatch):
    """CUDA stubbed: a capture records on the SearchGraphs' own stream (of the model's device, not torch's
    shared default stream), under the process's capture lock, in thread_local mode; once every kept shape
    is dropped, the next capture gets a new memory pool."""
    import nmt.device

    pools, captures = iter(range(100)), []
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: next(pools))
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: types.SimpleNamespace(device=device))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", type("Graph", (), {"replay": lambda self: None}))

    @contextlib.contextmanager
    def graph(graph, pool, stream, capture_error_mode):
        captures.append((pool, stream is graphs.stream, capture_error_mode, nmt.device._CAPTURE_LOCK.locked()))
        yield

    monkeypatch.setattr(torch.cuda, "graph", graph)
    model = random_model("bahdanau")
    src, lengths = source_batch()
    graphs = SearchGraphs(Decoding(model), capture=True, max_bytes=1)      # room for one shape at a time
    graphs.greedy(src, lengths)
    graphs.greedy(src, lengths)                                             # replayed: no capture
    graphs.greedy(src[:, :7][2:], lengths[2:])                              # another shape, alone
    assert graphs.stream.device == Decoding(model).device
    assert captures == [(0, True, "thread_local", True), (1, True, "thread_local", True)]
    assert graphs.captured == 2 and len(graphs.graphs) == 1

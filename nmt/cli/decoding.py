"""`nmt translate`, `nmt score` and `nmt serve`: options in, a Translator's work out."""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import typer

from nmt.api import load_translator
from nmt.cli.common import MODEL_HELP, app, fail, model_inputs, user_errors
from nmt.cli.options import decoding_options, given
from nmt.config import MAX_BEAM


@app.command()
@decoding_options()
def translate(
    checkpoint: list[Path] = typer.Option(..., "--checkpoint", "--model", "-m",
                                          help=MODEL_HELP + " Repeat it to decode with an ensemble."),
    input: Path | None = typer.Option(None, "--input", "-i", help="Source text; default stdin."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Translations; default stdout."),
    n_best: int = typer.Option(1, "--n-best", min=1, max=MAX_BEAM,
                               help="Write the K best of each input line (K <= beam size) as K lines "
                                    "'N ||| text ||| score' (N = 0-based input line, score = length-normalised "
                                    "log-probability); missing ones have empty text and score -inf (0 for an "
                                    "empty input line)."),
    num_samples: int | None = typer.Option(None, "--num-samples", min=1, max=MAX_BEAM,
                                           help="Samples per line (= --n-best; with --sampling)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda (cuda:N)."),
    threads: int = typer.Option(0, "--threads", min=0, max=1024, help="CPU threads; 0 = torch's default."),
    alignments: Path | None = typer.Option(None, "--alignments", help="Write Pharaoh word alignments (i-j)."),
    attention_out: Path | None = typer.Option(None, "--attention-out", help="Write attention as JSON lines."),
    plot_attention: Path | None = typer.Option(None, "--plot-attention", help="Write heatmap PNGs into this folder."),
    scores: Path | None = typer.Option(None, "--scores", help="Write 'log-prob<TAB>normalised score' per output line."),
    scores_json: bool = typer.Option(False, "--scores-json", help="Write --scores as JSON lines."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    prefix_file: Path | None = typer.Option(None, "--prefix-file", help="Target prefixes, one line per input line."),
    prefix_column: bool = typer.Option(False, "--prefix-column", help="Input lines are 'source<TAB>prefix'."),
    shortlist_file: Path | None = typer.Option(None, "--shortlist-file",
                                               help="A data folder's shortlist.npz, for a model without one "
                                                    "(implies --shortlist)."),
    **decoding: Any,
) -> None:
    """Translate text, one line out per line in, in input order.

    Only "\\n" ends an input line (a "\\r" before it belongs to a CRLF ending); invalid UTF-8 stops
    with an error naming the line: with --output nothing is written, on stdout nothing after it.
    The decoding options default to the model's `decoding` settings; one that the run would not use
    (--beam-size with --sampling, --top-k without it) is an error.
    """
    from nmt.decode.outputs import OutputPaths
    from nmt.decode.streaming import open_source
    from nmt.modelfile.onnx_folder import is_onnx_folder
    from nmt.progress import progress_bar

    if num_samples is not None:
        if not decoding["sampling"]:
            fail("--num-samples needs --sampling (for beam search use --n-best)")
        if n_best != 1 and n_best != num_samples:
            fail(f"--num-samples {num_samples} and --n-best {n_best} disagree; give one of them")
        n_best = num_samples
    outputs = OutputPaths(output, alignments, attention_out, scores, scores_json, plot_attention)
    with ExitStack() as stack, user_errors():
        source = open_source(stack, input, sys.stdin.buffer if sys.stdin is not None else None, prefix_file,
                             prefix_column)
        inputs = [("--input", input), ("--prefix-file", prefix_file), ("--shortlist-file", shortlist_file)]
        if any(map(is_onnx_folder, checkpoint)):                 # onnxruntime, no torch: nmt.runtime
            from nmt.runtime.translator import folder_inputs

            model_files = folder_inputs(checkpoint[0]) if len(checkpoint) == 1 else []   # an ensemble: refused below
        else:
            model_files = model_inputs(checkpoint)
        outputs.check([*inputs, *model_files], stdin=input is None)
        translator = load_translator(checkpoint, device, shortlist_file, threads, **given(decoding))
        translator.check_n_best(n_best, names=("--n-best", "--beam-size", "--sampling"))
        if decoding.get("early_stop") and translator.decoding.beam_size == 1 and not translator.decoding.sampling:
            fail("--early-stop applies only to beam search, and the beam size is 1 (greedy)")   # fixed for this run
        files = outputs.open(stack, sys.stdout)
        with progress_bar("translate", "sent", disable=quiet) as bar:      # log lines when stderr is a file
            translator.write_translations(source, files, n_best=n_best, progress=bar)
        sys.stdout.flush()
        outputs.commit()


@app.command()
@decoding_options("length_penalty", "batch_tokens", "precision")
def score(
    checkpoint: list[Path] = typer.Option(..., "--checkpoint", "--model", "-m",
                                          help=MODEL_HELP + " Repeat it to score with an ensemble."),
    src: Path = typer.Option(..., "--src", help="Source text, one sentence per line."),
    tgt: Path = typer.Option(..., "--tgt", help="Target text to score, line by line with --src."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Scores; default stdout."),
    json_lines: bool = typer.Option(False, "--json", help="JSON lines instead of 'log-prob<TAB>normalised': "
                                    "line (0-based, as translate --n-best), log_prob, score, length."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    threads: int = typer.Option(0, "--threads", min=0, max=1024, help="CPU threads; 0 = torch's default."),
    **decoding: Any,
) -> None:
    """The model's log-probability of given translations (forced decoding), for filtering and reranking.

    One line per pair: 'log-prob<TAB>length-normalised score' (or JSON with --json).
    """
    from nmt.decode.outputs import OutputPaths
    from nmt.decode.streaming import open_pairs, write_scores
    from nmt.modelfile.onnx_folder import is_onnx_folder

    for model in checkpoint:
        if is_onnx_folder(model):
            fail(f"--model {model} is an ONNX folder, which only translates; score with the PyTorch model file")
    outputs = OutputPaths(output)
    with ExitStack() as stack, user_errors():
        pairs = open_pairs(stack, src, tgt)
        outputs.check([("--src", src), ("--tgt", tgt), *model_inputs(checkpoint)], stdin=False)
        scorer = load_translator(checkpoint, device, threads=threads, **given(decoding))
        write_scores(scorer, pairs, outputs.open(stack, sys.stdout).text, json_lines)
        sys.stdout.flush()
        outputs.commit()


@app.command()
@decoding_options("precision", "quantize")
def serve(
    model: Path = typer.Option(..., "--model", "--checkpoint", "-m", help=MODEL_HELP),
    host: str = typer.Option("127.0.0.1", "--host", envvar="NMT_SERVE_HOST",
                             help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port; 0 = any free port (logged)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    threads: int = typer.Option(0, "--threads", min=0, max=1024, help="CPU threads; 0 = torch's default."),
    max_batch_sentences: int = typer.Option(128, "--max-batch-sentences", min=1,
                                            help="Sentences of concurrent requests translated together."),
    max_wait_ms: float = typer.Option(5.0, "--max-wait-ms", min=0.0, max=60_000.0,
                                      help="How long a batch waits for more requests once the model is free."),
    max_queue: int = typer.Option(256, "--max-queue", min=1, help="Requests waiting; more get 503 + Retry-After."),
    max_sentences: int = typer.Option(100, "--max-sentences", min=1, help="Sentences per request (else 413)."),
    max_body_kb: int = typer.Option(256, "--max-body-kb", min=1, help="Request body size in KiB (else 413)."),
    max_beam: int = typer.Option(16, "--max-beam", min=1, max=MAX_BEAM,
                                 help="Largest beam_size a request may ask for."),
    body_timeout: float = typer.Option(30.0, "--body-timeout", min=0.1, max=3600.0,
                                       help="Seconds for a request body to arrive (else 408)."),
    **decoding: Any,
) -> None:
    """Serve translations over HTTP: POST /translate, GET /health (needs the serve extra)."""
    try:
        from nmt.serve.server import ServeSettings, run_server
    except ImportError as exc:
        fail(f"nmt serve needs the serve extra: pip install 'nmt[serve]', or './runtime-dist[serve]' without "
             f"PyTorch ({exc})")
    settings = ServeSettings(host=host, port=port, max_batch_sentences=max_batch_sentences,
                             max_wait=max_wait_ms / 1000, max_queue=max_queue, max_sentences=max_sentences,
                             max_body_bytes=max_body_kb * 1024, max_beam=max_beam, body_timeout=body_timeout)
    with user_errors():
        code = run_server(model, settings, device=device, threads=threads, **given(decoding))
    raise typer.Exit(code)

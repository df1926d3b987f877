"""The `nmt` command line: thin wrappers that parse options, load the config and call a stage."""

from __future__ import annotations

import gc
import os
import sys
from contextlib import ExitStack
from pathlib import Path

import typer

from nmt import __version__
from nmt.config import ConfigError, load_config
from nmt.data.corpus import DataError

app = typer.Typer(
    help="RNN-attention neural machine translation: preprocess, train, translate, evaluate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigOption = typer.Option(..., "--config", "-c", help="YAML config file.", exists=False)
SetOption = typer.Option(None, "--set", help="Override a config key: --set training.lr=3e-4 (repeatable).")


def fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"nmt {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    """RNN-attention NMT toolkit."""


@app.command()
def preprocess(
    config: Path = ConfigOption,
    overrides: list[str] | None = SetOption,
    force: bool = typer.Option(False, "--force", help="Rebuild even if the output is up to date."),
) -> None:
    """Train SentencePiece and encode train/dev/test into id files with a manifest."""
    from nmt.data.preprocess import preprocess as run_preprocess

    try:
        run_preprocess(load_config(config, overrides or []), force=force)
    except (ConfigError, DataError) as exc:
        fail(str(exc))


@app.command()
def train(
    config: Path = ConfigOption,
    overrides: list[str] | None = SetOption,
    resume: bool = typer.Option(False, "--resume", help="Continue the run in training.run_dir from last.pt."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Delete a non-empty run folder and start over."),
) -> None:
    """Train a seq2seq model; checkpoints and metrics go to training.run_dir."""
    from nmt.train.checkpoint import CheckpointError
    from nmt.train.trainer import RunDirError, Trainer

    if resume and overwrite:
        fail("--resume and --overwrite exclude each other")
    try:
        trainer = Trainer(load_config(config, overrides or []), resume=resume, overwrite=overwrite)
        trainer.train()
    except (ConfigError, DataError, CheckpointError, RunDirError) as exc:
        fail(str(exc))


def _open_output(path: Path | None):
    """stdout, or a temporary file beside `path` that `_finish_output` renames into place."""
    if path is None:
        return sys.stdout, None
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    return open(tmp, "w", encoding="utf-8"), tmp


def _finish_output(handle, tmp: Path | None, path: Path | None, ok: bool) -> None:
    if tmp is None:
        handle.flush()
        return
    handle.close()
    if ok:
        os.replace(tmp, path)
    else:
        tmp.unlink(missing_ok=True)


@app.command()
def translate(
    checkpoint: list[Path] = typer.Option(..., "--checkpoint", help="A checkpoint inside its run folder, e.g. "
                                          "RUN/best.pt; repeat it to decode with an ensemble."),
    input: Path | None = typer.Option(None, "--input", "-i", help="Source text; default stdin."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Translations; default stdout."),
    beam_size: int | None = typer.Option(None, "--beam-size", min=1, help="1 = greedy; default from config."),
    length_penalty: float | None = typer.Option(None, "--length-penalty", min=0.0, help="GNMT alpha."),
    batch_tokens: int | None = typer.Option(None, "--batch-tokens", min=1, help="Source tokens x beam per batch."),
    n_best: int = typer.Option(1, "--n-best", min=1, help="Write the K best as 'line ||| text ||| score'."),
    no_repeat_ngram: int | None = typer.Option(None, "--no-repeat-ngram", min=0, help="Block repeated n-grams."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    precision: str | None = typer.Option(None, "--precision", help="auto, fp32, bf16 or fp16; default from config."),
    threads: int = typer.Option(0, "--threads", min=0, help="CPU threads; 0 = torch's default."),
    alignments: Path | None = typer.Option(None, "--alignments", help="Write Pharaoh word alignments (i-j)."),
    attention_out: Path | None = typer.Option(None, "--attention-out", help="Write attention as JSON lines."),
    plot_attention: Path | None = typer.Option(None, "--plot-attention", help="Write heatmap PNGs into this folder."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    min_len: int | None = typer.Option(None, "--min-len", min=0, help="No EOS before this many pieces."),
    max_len: int | None = typer.Option(None, "--max-len", min=0, help="At most this many pieces (EOS included)."),
    max_len_ratio: float | None = typer.Option(None, "--max-len-ratio", min=0.0, help="At most ratio*source+10."),
    max_input_len: int | None = typer.Option(None, "--max-input-len", min=1, help="Truncate longer inputs."),
    coverage_penalty: float | None = typer.Option(None, "--coverage-penalty", min=0.0, help="GNMT beta (beam)."),
    replace_unk: bool | None = typer.Option(None, "--replace-unk/--no-replace-unk",
                                            help="Copy the most attended source piece for each <unk>."),
    sampling: bool | None = typer.Option(None, "--sampling/--no-sampling", help="Sample instead of searching."),
    temperature: float | None = typer.Option(None, "--temperature", help="Sampling temperature."),
    top_k: int | None = typer.Option(None, "--top-k", min=0, help="Sample from the k most probable; 0 = all."),
    top_p: float | None = typer.Option(None, "--top-p", help="Sample from the top-p probability mass."),
    seed: int | None = typer.Option(None, "--seed", help="Sampling seed (same seed and batches, same samples)."),
    num_samples: int | None = typer.Option(None, "--num-samples", min=1, help="Samples per line (= --n-best)."),
    prefix_file: Path | None = typer.Option(None, "--prefix-file", help="Target prefixes, one line per input line."),
    prefix_column: bool = typer.Option(False, "--prefix-column", help="Input lines are 'source<TAB>prefix'."),
    scores: Path | None = typer.Option(None, "--scores", help="Write 'log-prob<TAB>normalised score' per output line."),
    scores_json: bool = typer.Option(False, "--scores-json", help="Write --scores as JSON lines."),
) -> None:
    """Translate text, one line out per line in, in input order."""
    from tqdm import tqdm

    from nmt.decode.translator import OutputFiles, Translator
    from nmt.train.checkpoint import CheckpointError

    if input is not None and not input.is_file():
        fail(f"input file {input} does not exist")
    if prefix_file is not None and not prefix_file.is_file():
        fail(f"prefix file {prefix_file} does not exist")
    if prefix_file is not None and prefix_column:
        fail("--prefix-file and --prefix-column exclude each other")
    if num_samples is not None:
        if not sampling:
            fail("--num-samples needs --sampling (for beam search use --n-best)")
        if n_best != 1 and n_best != num_samples:
            fail(f"--num-samples {num_samples} and --n-best {n_best} disagree; give one of them")
        n_best = num_samples
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        translator = Translator.from_checkpoints(
            checkpoint, device, beam_size=beam_size, length_penalty=length_penalty, batch_tokens=batch_tokens,
            no_repeat_ngram=no_repeat_ngram, precision=precision, min_len=min_len, max_len=max_len,
            max_len_ratio=max_len_ratio, max_input_len=max_input_len, coverage_penalty=coverage_penalty,
            replace_unk=replace_unk, sampling=sampling, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        translator.check_n_best(n_best)
    except (ConfigError, CheckpointError) as exc:
        fail(str(exc))
    plotter = None
    if plot_attention is not None:
        from nmt.plot import AttentionPlotter, PlotUnavailable

        try:
            plotter = AttentionPlotter(plot_attention)
        except PlotUnavailable as exc:
            fail(str(exc))
    with ExitStack() as stack:
        source = stack.enter_context(open(input, encoding="utf-8")) if input else sys.stdin
        prefixes = stack.enter_context(open(prefix_file, encoding="utf-8")) if prefix_file else None
        if prefix_column:
            source, prefixes = _split_prefix_column(source)
        out, tmp = _open_output(output)
        scores_out, scores_tmp = _open_output(scores) if scores is not None else (None, None)
        files = OutputFiles(
            out,
            stack.enter_context(open(alignments, "w", encoding="utf-8")) if alignments else None,
            stack.enter_context(open(attention_out, "w", encoding="utf-8")) if attention_out else None,
            plotter,
            scores_out,
            scores_json,
        )
        ok = False
        try:
            with tqdm(desc="translate", unit="sent", file=sys.stderr, disable=quiet) as bar:
                translator.write_translations(source, files, n_best=n_best, progress=bar, prefixes=prefixes)
            ok = True
        except UnicodeDecodeError as exc:
            fail(f"{input or 'stdin'}: invalid UTF-8 in the input ({exc.reason})")
        except ValueError as exc:                       # prefixes and input of different lengths
            fail(f"{prefix_file or input or 'stdin'}: {exc}")
        finally:
            _finish_output(out, tmp, output, ok)
            if scores_out is not None:
                _finish_output(scores_out, scores_tmp, scores, ok)


def _split_prefix_column(lines):
    """'source<TAB>prefix' lines -> a stream of sources and a stream of prefixes ("" without a tab)."""
    import itertools

    pairs_a, pairs_b = itertools.tee(line.rstrip("\r\n").split("\t", 1) for line in lines)
    return (pair[0] for pair in pairs_a), (pair[1] if len(pair) > 1 else "" for pair in pairs_b)


@app.command()
def score(
    checkpoint: list[Path] = typer.Option(..., "--checkpoint", help="A checkpoint (repeat it for an ensemble)."),
    src: Path = typer.Option(..., "--src", help="Source text, one sentence per line."),
    tgt: Path = typer.Option(..., "--tgt", help="Target text to score, line by line with --src."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Scores; default stdout."),
    json_lines: bool = typer.Option(False, "--json", help="JSON lines instead of 'log-prob<TAB>normalised'."),
    length_penalty: float | None = typer.Option(None, "--length-penalty", min=0.0, help="GNMT alpha."),
    batch_tokens: int | None = typer.Option(None, "--batch-tokens", min=1, help="Source+target tokens per batch."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    threads: int = typer.Option(0, "--threads", min=0, help="CPU threads; 0 = torch's default."),
) -> None:
    """The model's log-probability of given translations (forced decoding), for filtering and reranking."""
    import json

    from nmt.decode.translator import Translator
    from nmt.train.checkpoint import CheckpointError

    for path in (src, tgt):
        if not path.is_file():
            fail(f"{path} does not exist")
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        scorer = Translator.from_checkpoints(checkpoint, device, length_penalty=length_penalty,
                                             batch_tokens=batch_tokens)
    except (ConfigError, CheckpointError) as exc:
        fail(str(exc))
    out, tmp = _open_output(output)
    ok = False
    try:
        with open(src, "rb") as sources, open(tgt, "rb") as targets:
            number = 0
            for chunk in _parallel_chunks(sources, targets, src, tgt):
                for log_prob, normalised, length in scorer.score(*chunk):
                    if json_lines:
                        out.write(json.dumps({"line": number, "log_prob": round(log_prob, 6),
                                              "score": round(normalised, 6), "length": length}) + "\n")
                    else:
                        out.write(f"{log_prob:.6f}\t{normalised:.6f}\n")
                    number += 1
        ok = True
    finally:
        _finish_output(out, tmp, output, ok)


def _parallel_chunks(sources, targets, src_path: Path, tgt_path: Path, size: int = 10000):
    """Lists of (sources, targets) of up to `size` lines; only '\n' ends a line; one-line errors on
    bad UTF-8 or different line counts."""
    import itertools

    def decoded(handle, path: Path):
        for number, raw in enumerate(handle, 1):
            try:
                yield raw.decode("utf-8").removesuffix("\n").removesuffix("\r")
            except UnicodeDecodeError as exc:
                fail(f"{path} line {number}: invalid UTF-8 ({exc.reason})")

    src_lines, tgt_lines = decoded(sources, src_path), decoded(targets, tgt_path)
    count = 0
    while True:
        chunk_src, chunk_tgt = list(itertools.islice(src_lines, size)), list(itertools.islice(tgt_lines, size))
        if len(chunk_src) != len(chunk_tgt):
            fail(f"{src_path} and {tgt_path} have different numbers of lines (they differ after line "
                 f"{count + min(len(chunk_src), len(chunk_tgt))}); they must align line by line")
        if not chunk_src:
            return
        count += len(chunk_src)
        yield chunk_src, chunk_tgt


@app.command()
def evaluate(
    ref: Path = typer.Option(..., "--ref", "-r", help="Reference translations, raw text."),
    hyp: Path | None = typer.Option(None, "--hyp", help="Hypotheses to score."),
    checkpoint: Path | None = typer.Option(None, "--checkpoint", help="Translate --src with this first."),
    src: Path | None = typer.Option(None, "--src", help="Source text (with --checkpoint)."),
    compare: Path | None = typer.Option(None, "--compare", help="Second system: paired bootstrap test."),
    ter: bool = typer.Option(False, "--ter", help="Also compute TER."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the scores as JSON here ('-' = stdout)."),
    beam_size: int | None = typer.Option(None, "--beam-size", min=1),
    device: str = typer.Option("auto", "--device"),
    bootstrap_samples: int = typer.Option(1000, "--bootstrap-samples", min=10),
) -> None:
    """Score hypotheses (or a checkpoint's translations) with sacreBLEU BLEU and chrF."""
    import json

    from nmt import evaluate as ev

    try:
        refs = ev.read_text(ref)
        if checkpoint is not None:
            if src is None or hyp is not None:
                fail("--checkpoint needs --src (and no --hyp)")
            from nmt.decode.translator import Translator
            from nmt.train.checkpoint import CheckpointError

            try:
                translator = Translator.from_checkpoint(checkpoint, device, beam_size=beam_size)
            except (CheckpointError, ConfigError) as exc:
                fail(str(exc))
            hyps = [t.text for t in translator.translate_stream(ev.read_text(src))]
            hyp_name = f"{checkpoint} on {src}"
        elif hyp is not None:
            hyps, hyp_name = ev.read_text(hyp), str(hyp)
        else:
            fail("give --hyp FILE, or --checkpoint C --src FILE")
        ev.check_lengths(hyps, refs, hyp_name, str(ref))
        results = ev.score(hyps, refs, ter=ter)
        if compare is not None:
            other = ev.read_text(compare)
            ev.check_lengths(other, refs, str(compare), str(ref))
            results["comparison"] = ev.compare(hyps, other, refs, ter=ter, samples=bootstrap_samples)
    except ev.EvaluationError as exc:
        fail(str(exc))
    payload = json.dumps({"hypotheses": hyp_name, "references": str(ref), **results}, indent=2)
    if json_out is not None and str(json_out) == "-":
        typer.echo(payload)
        return
    if json_out is not None:
        json_out.write_text(payload + "\n", encoding="utf-8")
    typer.echo(ev.format_report(results, hyp_name, str(ref)))


@app.command()
def average(
    checkpoints: list[Path] = typer.Argument(..., help="Checkpoints of one run to average."),
    output: Path = typer.Option(..., "--output", "-o", help="The averaged checkpoint (in the same run folder)."),
) -> None:
    """Average the parameters of several checkpoints into a new one."""
    from nmt.train.checkpoint import CheckpointError, average_checkpoints, save_checkpoint

    if output.exists():
        fail(f"{output} exists; choose a new name (checkpoints are never overwritten in place)")
    try:
        state = average_checkpoints(checkpoints)
    except CheckpointError as exc:
        fail(str(exc))
    save_checkpoint(output, {k: v for k, v in state.items() if k not in ("format", "nmt_version")})
    typer.echo(f"averaged {len(checkpoints)} checkpoints into {output}", err=True)


plot_app = typer.Typer(help="Pictures: attention heatmaps and training curves (needs the plot extra: matplotlib).",
                       no_args_is_help=True)
app.add_typer(plot_app, name="plot")


@plot_app.command("attention")
def plot_attention_command(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="A checkpoint inside its run folder."),
    src: list[str] = typer.Option(..., "--src", help="A source sentence (repeatable)."),
    out: Path = typer.Option(Path("attention"), "--out", "-o", help="Folder for the PNG files."),
    beam_size: int | None = typer.Option(None, "--beam-size", min=1),
    device: str = typer.Option("auto", "--device"),
) -> None:
    """Translate sentences and draw each one's attention as a heatmap PNG."""
    from nmt.decode.translator import OutputFiles, Translator
    from nmt.plot import AttentionPlotter, PlotUnavailable
    from nmt.train.checkpoint import CheckpointError

    try:
        plotter = AttentionPlotter(out)
        translator = Translator.from_checkpoint(checkpoint, device, beam_size=beam_size)
    except (PlotUnavailable, CheckpointError, ConfigError) as exc:
        fail(str(exc))
    translator.write_translations(src, OutputFiles(sys.stdout, plotter=plotter))
    typer.echo(f"wrote {len(src)} heatmap(s) to {out}", err=True)


@plot_app.command("curves")
def plot_curves_command(
    run_dirs: list[Path] = typer.Argument(..., help="Run folders (each with metrics.jsonl)."),
    out: Path = typer.Option(Path("curves.png"), "--out", "-o", help="The PNG to write."),
) -> None:
    """Draw train loss, dev perplexity and dev BLEU of one or more runs."""
    from nmt.plot import PlotUnavailable, plot_curves

    try:
        plot_curves(run_dirs, out)
    except (PlotUnavailable, FileNotFoundError) as exc:
        fail(str(exc))
    typer.echo(f"wrote {out}", err=True)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        gc.freeze()   # exit without a last garbage-collector walk over torch's objects: 0.3 s of every command

"""The `nmt` command line: thin wrappers that parse options, load the config and call a stage."""

from __future__ import annotations

import contextlib
import errno
import gc
import io
import os
import re
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import typer

from nmt import __version__
from nmt.cli_options import decoding_options, given
from nmt.config import MAX_BEAM, ConfigError, load_config
from nmt.data.corpus import DataError
from nmt.folders import FolderError, register_file, remove_leftovers
from nmt.output_files import check_outputs, output_target
from nmt.process import configure_process

app = typer.Typer(
    help="RNN-attention neural machine translation: preprocess, train, translate, evaluate.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,           # plain help: rich tables cut option names at 80 columns
    pretty_exceptions_enable=False,
)

ConfigOption = typer.Option(..., "--config", "-c", help="YAML config file.", exists=False)
MODEL_HELP = "A model file (nmt export) or a training checkpoint, e.g. model.nmt or RUN/best.pt."
SetOption = typer.Option(None, "--set", help="Override a config key: --set training.lr=3e-4 (repeatable).")


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: unwind (temporary files are removed on the way) and exit 128 + signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


def _interrupt(signum: int, _frame: object) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):     # a second signal must not interrupt the cleanup
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


class ClosedStdout(io.TextIOBase):
    """Stands in for a stdout the shell closed (`nmt translate >&-`): writing to it is an error, as in a shell."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "stdout is closed (>&-); leave it open, or write to a file where the "
                                   "command has an option for one")


def _occupy_closed_descriptors() -> None:
    """Open /dev/null on a closed stdin, stdout or stderr (`>&-`), so that no file nmt opens later gets
    descriptor 0, 1 or 2 and receives what a library prints; writing to the closed stdout stays an error."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdout is None:                  # Python's stand-in for a descriptor 1 closed at start
        sys.stdout = ClosedStdout()
    if sys.stderr is None:                  # messages and progress bars go where the user sent them: nowhere
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115


def one_line(message: str) -> str:
    return " ".join(str(message).split())


def fail(message: str) -> None:
    typer.echo(f"error: {one_line(message)}", err=True)
    raise typer.Exit(code=2)


def as_options(message: str) -> str:
    """A decoding key in a message as the option that sets it: `decoding.beam_size` -> `--beam-size`."""
    return re.sub(r"`decoding\.(\w+)`", lambda m: f"`--{m.group(1).replace('_', '-')}`", message)


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
        run_preprocess(load_config(config, overrides or []), force=force, config_path=config)
    except (ConfigError, DataError, FolderError) as exc:
        fail(str(exc))


@app.command()
def train(
    config: Path = ConfigOption,
    overrides: list[str] | None = SetOption,
    resume: bool = typer.Option(False, "--resume", help="Continue the run in training.run_dir from last.pt."),
    overwrite: bool = typer.Option(False, "--overwrite",
                                   help="Delete what nmt wrote in the run folder and start over (never other files)."),
) -> None:
    """Train a seq2seq model; checkpoints and metrics go to training.run_dir.

    SIGINT/SIGTERM save last.pt at the current update and exit 130/143; --resume continues.
    """
    configure_process(training=True)             # before torch's first oneDNN call
    from nmt.train.checkpoint import CheckpointError
    from nmt.train.trainer import RunDirError
    from nmt.train.trainer import train as run_training

    if resume and overwrite:
        fail("--resume and --overwrite exclude each other")
    try:
        trainer = run_training(load_config(config, overrides or []), resume=resume, overwrite=overwrite,
                               config_path=config)
    except (ConfigError, DataError, CheckpointError, RunDirError, FolderError) as exc:
        fail(str(exc))
    except FloatingPointError as exc:
        fail(f"{exc}; lower training.lr or raise training.clip_grad_norm, then --resume from last.pt")
    if trainer.stop_signal is not None:
        raise typer.Exit(code=128 + trainer.stop_signal)


def _check_outputs(inputs: dict[str, Path | None], outputs: dict[str, Path | None],
                   models: Sequence[Path] = (), stdin: bool = False) -> dict[str, Path]:
    """`check_outputs` (nmt.output_files) with the models as inputs; a problem is one `error:` line."""
    try:
        return check_outputs(outputs, [*inputs.items(), *(("--model", model) for model in models)], stdin=stdin)
    except FolderError as exc:
        fail(str(exc))
        return {}


@contextlib.contextmanager
def _user_errors() -> Iterator[None]:
    """nmt's own errors (ConfigError, ModelFileError, TextInputError, FolderError, ...) as one `error:` line,
    decoding keys named as their options; what went to stdout before stays complete."""
    try:
        yield
    except Exception as exc:
        if not _is_user_error(exc) and type(exc).__name__ != "PlotUnavailable":
            raise
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        fail(as_options(str(exc)))


def _set_threads(threads: int) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


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
    from nmt.decode.translator import Translator
    from nmt.device import reuse_freed_memory
    from nmt.progress import progress_bar

    if num_samples is not None:
        if not decoding["sampling"]:
            fail("--num-samples needs --sampling (for beam search use --n-best)")
        if n_best != 1 and n_best != num_samples:
            fail(f"--num-samples {num_samples} and --n-best {n_best} disagree; give one of them")
        n_best = num_samples
    outputs = OutputPaths(output, alignments, attention_out, scores, scores_json, plot_attention)
    with ExitStack() as stack, _user_errors():
        source = open_source(stack, input, sys.stdin.buffer if sys.stdin is not None else None, prefix_file,
                             prefix_column)
        inputs = [("--input", input), ("--prefix-file", prefix_file), ("--shortlist-file", shortlist_file)]
        outputs.check([*inputs, *(("--model", model) for model in checkpoint)], stdin=input is None)
        _set_threads(threads)
        reuse_freed_memory()
        translator = Translator.load(checkpoint, device, shortlist_file=shortlist_file, **given(decoding))
        translator.check_n_best(n_best, names=("--n-best", "--beam-size", "--sampling"))
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
    from nmt.decode.translator import Translator

    outputs = OutputPaths(output)
    with ExitStack() as stack, _user_errors():
        pairs = open_pairs(stack, src, tgt)
        outputs.check([("--src", src), ("--tgt", tgt), *(("--model", model) for model in checkpoint)], stdin=False)
        _set_threads(threads)
        scorer = Translator.load(checkpoint, device, **given(decoding))
        write_scores(scorer, pairs, outputs.open(stack, sys.stdout).text, json_lines)
        sys.stdout.flush()
        outputs.commit()


@app.command()
def evaluate(
    ref: list[Path] = typer.Option(..., "--ref", "-r",
                                   help="Reference translations, raw text; repeat it for several references."),
    hyp: Path | None = typer.Option(None, "--hyp", help="Hypotheses to score."),
    checkpoint: Path | None = typer.Option(None, "--checkpoint", "--model", "-m",
                                           help="Translate --src with this model file or checkpoint first."),
    src: Path | None = typer.Option(None, "--src", help="Source text (with --checkpoint)."),
    compare: Path | None = typer.Option(None, "--compare", help="Second system: paired bootstrap test."),
    ter: bool = typer.Option(False, "--ter", help="Also compute TER."),
    tokenize: str = typer.Option("13a", "--tokenize",
                                 help="BLEU's sacreBLEU tokenizer: 13a, intl, zh, ja-mecab (nmt[ja]), "
                                      "ko-mecab (nmt[ko]), char, flores200 (downloads a model once) or none."),
    lowercase: bool = typer.Option(False, "--lowercase", help="Case-insensitive BLEU and chrF."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the scores as JSON here ('-' = stdout)."),
    beam_size: int | None = typer.Option(None, "--beam-size", min=1),
    device: str = typer.Option("auto", "--device"),
    bootstrap_samples: int = typer.Option(1000, "--bootstrap-samples", min=10, max=100_000),
) -> None:
    """Score hypotheses (or a checkpoint's translations) with sacreBLEU BLEU and chrF.

    Only "\\n" ends a line (a "\\r" before it belongs to a CRLF ending). The signatures
    name the tokenizer, the case and the number of references.
    """
    import json

    from nmt import evaluate as ev

    if json_out is not None and str(json_out) != "-":
        inputs = [("--hyp", hyp), ("--src", src), ("--compare", compare), *(("--ref", r) for r in ref)]
        try:
            check_outputs({"--json": json_out}, [*inputs, *((("--model", checkpoint),) if checkpoint else ())])
        except FolderError as exc:
            fail(str(exc))
    try:
        ev.bleu_metric(tokenize, lowercase)               # a tokenizer that cannot run here: before any work
        refs = [ev.read_text(path) for path in ref]
        if checkpoint is not None:
            if src is None or hyp is not None:
                fail("--checkpoint needs --src (and no --hyp)")
            from nmt.decode.translator import Translator
            from nmt.model.modelfile import ModelFileError

            try:
                translator = Translator.load(checkpoint, device, beam_size=beam_size)
            except (ModelFileError, ConfigError) as exc:
                fail(as_options(str(exc)))
            hyps = [t.text for t in translator.translate_stream(ev.read_text(src))]
            hyp_name = f"{checkpoint} on {src}"
        elif hyp is not None:
            hyps, hyp_name = ev.read_text(hyp), str(hyp)
        else:
            fail("give --hyp FILE, or --checkpoint C --src FILE")
        for path, lines in zip(ref, refs, strict=True):
            ev.check_lengths(hyps, lines, hyp_name, str(path))
        results = ev.score(hyps, refs, ter=ter, tokenize=tokenize, lowercase=lowercase)
        if compare is not None:
            other = ev.read_text(compare)
            for path, lines in zip(ref, refs, strict=True):
                ev.check_lengths(other, lines, str(compare), str(path))
            results["comparison"] = ev.compare(hyps, other, refs, ter=ter, samples=bootstrap_samples,
                                               tokenize=tokenize, lowercase=lowercase)
    except ev.EvaluationError as exc:
        fail(str(exc))
    ref_names = [str(path) for path in ref]
    references = ref_names[0] if len(ref_names) == 1 else ref_names      # a list only for several
    payload = json.dumps({"hypotheses": hyp_name, "references": references, **results}, indent=2)
    if json_out is not None and str(json_out) == "-":
        typer.echo(payload)
        return
    typer.echo(ev.format_report(results, hyp_name, ", ".join(ref_names)))  # first: a closed stdout fails first
    if json_out is not None:
        from nmt.folders import atomic_write

        target = output_target(json_out, "--json")     # checked above; a link changed since is refused
        remove_leftovers(target.parent, target.name)
        atomic_write(target, lambda handle: handle.write(payload + "\n"), mode="w")


@app.command()
def average(
    checkpoints: list[Path] = typer.Argument(..., help="Checkpoints of one run to average."),
    output: Path = typer.Option(..., "--output", "-o", help="The averaged checkpoint (in the same run folder)."),
) -> None:
    """Average the parameters of several checkpoints into a new one."""
    from nmt.train.checkpoint import CheckpointError, average_checkpoints, save_checkpoint

    if output.exists():
        fail(f"{output} exists; choose a new name (checkpoints are never overwritten in place)")
    target = _check_outputs({}, {"--output": output}, checkpoints)["--output"]
    if len({os.path.realpath(path) for path in checkpoints}) < 2:   # one file's "average" is a mislabelled copy
        named = ", ".join(dict.fromkeys(map(str, checkpoints)))
        fail(f"averaging needs at least two different checkpoints, got {named}; give several, e.g. RUN/best-step*.pt")
    try:
        state = average_checkpoints(checkpoints)
    except CheckpointError as exc:
        fail(str(exc))
    save_checkpoint(target, {k: v for k, v in state.items() if k not in ("format", "nmt_version")})
    register_file(target)                   # `train --overwrite` may delete it with the rest of the run
    typer.echo(f"averaged {len(checkpoints)} checkpoints into {output}", err=True)


@app.command()
def export(
    checkpoint: Path = typer.Argument(..., help="A training checkpoint (e.g. RUN/best.pt) or a model file."),
    output: Path = typer.Option(..., "--output", "-o",
                                help="The model file to write (model.nmt), or with --format hf a new folder."),
    dtype: str = typer.Option("fp32", "--dtype", help="Weights stored as fp32, fp16 or bf16 (half the size)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing nmt model file at --output."),
    quantize: str | None = typer.Option(None, "--quantize",
                                        help="int8: the file decodes with int8 products by default (CPU); none."),
    layout: str = typer.Option("nmt", "--format",
                               help="nmt: one model file; hf: a Hugging Face model folder (model.safetensors, "
                                    "config.json, SentencePiece models, README.md card)."),
    score: list[str] | None = typer.Option(None, "--score", metavar="TESTSET=FILE",
                                           help="hf: a test set's `nmt evaluate --json` result, for the card's "
                                                "model-index, e.g. multi30k_test_2016_flickr=test.json "
                                                "(repeatable)."),
    card_license: str | None = typer.Option(None, "--license", help="hf: the card's license id (default unknown)."),
) -> None:
    """Write one self-contained model file (safetensors: weights without optimiser state, config,
    tokenizer, card), or with --format hf a folder to share on the Hugging Face Hub."""
    from nmt.model.modelfile import DTYPES, ModelFileError, describe, export_model, format_card, load_model

    if dtype not in DTYPES:
        fail(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if layout not in ("nmt", "hf"):
        fail(f"--format must be nmt or hf, got {layout!r}")
    if layout == "hf":
        _export_hf(checkpoint, output, dtype, quantize, force, score or [], card_license)
        return
    given = [name for name, value in (("--score", score), ("--license", card_license)) if value]
    if given:
        fail(f"{given[0]} applies only to --format hf (the model card of a Hugging Face folder)")
    if output.is_dir():
        fail(f"--output {output} is a folder; give a file name such as {output / 'model.nmt'} "
             "(or --format hf to write a Hugging Face folder)")
    if not output.parent.is_dir():
        fail(f"--output {output}: folder {output.parent} does not exist")
    target = _check_outputs({}, {"--output": output}, [checkpoint])["--output"]
    if target.exists():
        if not force:
            fail(f"{output} exists; choose a new name, or pass --force to replace an nmt model file")
        try:
            if load_model(target).kind != "model":
                raise ModelFileError("a checkpoint")
        except (ModelFileError, ConfigError):
            fail(f"{output} exists and is not an nmt model file; nmt replaces only its own model files")
    try:
        export_model(checkpoint, target, dtype, quantize)
        info = describe(load_model(target))
    except (ModelFileError, ConfigError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror or exc}")
    size = target.stat().st_size / 2**20
    typer.echo(f"wrote {output} ({size:.1f} MB)\n\n{format_card(info)}", err=True)


def _export_hf(checkpoint: Path, output: Path, dtype: str, quantize: str | None, force: bool, scores: list[str],
               card_license: str | None) -> None:
    """`nmt export --format hf`: a new folder in the Hugging Face layout (nmt.model.hf_layout)."""
    from nmt.model.hf_layout import ExportError, export_hf, read_score
    from nmt.model.modelfile import ModelFileError, describe, format_card

    if force:
        fail("--force applies only to --format nmt; --format hf writes only a new or empty folder")
    try:
        target = output_target(output, "--output")
        read = [read_score(option) for option in scores]
        loaded = export_hf(checkpoint, target, dtype, quantize, read, card_license or "unknown")
    except (ExportError, FolderError, ModelFileError, ConfigError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror or exc}")
    size = (target / "model.safetensors").stat().st_size / 2**20
    typer.echo(f"wrote {output}/ (model.safetensors {size:.1f} MB, config.json, source.spm, target.spm, "
               f"vocab.json, README.md with {len(read)} test scores)\n\n{format_card(describe(loaded))}", err=True)


@app.command()
def info(
    model: Path = typer.Argument(..., help=MODEL_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print the card as JSON instead of Markdown."),
    allow_nonfinite: bool = typer.Option(False, "--allow-nonfinite", help="Show a model with NaN/inf weights."),
) -> None:
    """Show the model card: languages, vocabulary, parameters, data, scores (after checking the file)."""
    import json

    from nmt.model.modelfile import ModelFileError, describe, format_card, load_model

    try:
        card = describe(load_model(model, allow_nonfinite=allow_nonfinite))
    except (ModelFileError, ConfigError) as exc:
        fail(str(exc))
    architecture = card["architecture"]
    if architecture["attention"] == "bahdanau":  # its decoder feeds c_i, never h~ (nmt.model.seq2seq): n/a
        architecture["input_feeding"] = None
    typer.echo(json.dumps(card, indent=2, ensure_ascii=False) if json_out else format_card(card))


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
    from nmt.model.modelfile import ModelFileError

    try:
        from nmt.serve import ServeSettings, run_server
    except ImportError as exc:
        fail(f"nmt serve needs the serve extra: pip install 'nmt[serve]' ({exc})")
    settings = ServeSettings(host=host, port=port, max_batch_sentences=max_batch_sentences,
                             max_wait=max_wait_ms / 1000, max_queue=max_queue, max_sentences=max_sentences,
                             max_body_bytes=max_body_kb * 1024, max_beam=max_beam, body_timeout=body_timeout)
    try:
        code = run_server(model, settings, device=device, threads=threads, **given(decoding))
    except (ModelFileError, ConfigError, OSError) as exc:
        fail(as_options(str(exc)))
    raise typer.Exit(code)


plot_app = typer.Typer(help="Pictures: attention heatmaps and training curves (needs the plot extra: matplotlib).",
                       rich_markup_mode=None,
                       no_args_is_help=True)
app.add_typer(plot_app, name="plot")


@plot_app.command("attention")
def plot_attention_command(
    checkpoint: Path = typer.Option(..., "--checkpoint", "--model", "-m", help=MODEL_HELP),
    src: list[str] = typer.Option(..., "--src", help="A source sentence (repeatable)."),
    out: str = typer.Option("attention", "--out", "-o",
                            help="A folder for one PNG per sentence (one that exists, ends with /, or has no "
                                 "suffix), or one image file for one --src: att.png, att.pdf, att.svg."),
    beam_size: int | None = typer.Option(None, "--beam-size", min=1),
    device: str = typer.Option("auto", "--device"),
) -> None:
    """Translate sentences and draw each one's attention as a heatmap."""
    from nmt.decode.translator import OutputFiles, Translator
    from nmt.model.modelfile import ModelFileError
    from nmt.plot import PlotError, PlotUnavailable, attention_output, is_folder_target

    one_file = not is_folder_target(out)
    try:
        if one_file:
            check_outputs({"--out": Path(out)}, [("--model", checkpoint)])
        plotter = attention_output(out, len(src), "--out")
        translator = Translator.load(checkpoint, device, beam_size=beam_size)
    except (PlotUnavailable, PlotError, ModelFileError, ConfigError, FolderError) as exc:
        fail(str(exc))
    translator.write_translations(src, OutputFiles(sys.stdout, plotter=plotter))
    skipped = len(src) - len(plotter.written)          # an empty sentence has no attention to draw
    if one_file and skipped:
        fail(f"--src is empty: an empty sentence has no attention to draw; nothing was written to {out}")
    typer.echo(f"wrote {len(plotter.written)} heatmap(s) to {out}"
               + (f"; {skipped} empty sentence(s) have none" if skipped else ""), err=True)


@plot_app.command("curves")
def plot_curves_command(
    run_dirs: list[Path] = typer.Argument(..., help="Run folders (each with metrics.jsonl)."),
    out: Path = typer.Option(Path("curves.png"), "--out", "-o", help="The PNG to write."),
) -> None:
    """Draw train loss, dev perplexity and dev BLEU of one or more runs."""
    from nmt.plot import PlotError, PlotUnavailable, plot_curves

    inputs = [(str(run / name), run / name) for run in run_dirs for name in ("metrics.jsonl", "config.yaml")]
    try:
        check_outputs({"--out": out}, inputs)
        plot_curves(run_dirs, out)
    except (PlotUnavailable, PlotError, FileNotFoundError, FolderError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{exc.filename}: {exc.strerror}")
    typer.echo(f"wrote {out}", err=True)


def _is_user_error(exc: BaseException) -> bool:
    """nmt's own exception classes (ConfigError, DataError, CheckpointError, ...) describe user errors."""
    return isinstance(exc, ValueError) and type(exc).__module__.startswith("nmt.")


def main() -> None:
    """Run a command; every failure is one `error:` line (exit 2), a signal exits 128 + its number."""
    try:                                 # typer >= 0.20 carries its own copy of click
        from typer._click.exceptions import ClickException, NoArgsIsHelpError
    except ImportError:
        from click.exceptions import ClickException, NoArgsIsHelpError

    configure_process()              # before torch's first oneDNN call; imports no torch
    _occupy_closed_descriptors()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    code = 0
    try:
        code = app(standalone_mode=False) or 0
    except NoArgsIsHelpError as exc:
        exc.show()
        code = 2
    except ClickException as exc:
        typer.echo(f"error: {one_line(exc.format_message())} (see --help)", err=True)
        code = 2
    except Interrupted as exc:
        print(f"interrupted ({exc})", file=sys.stderr)
        with contextlib.suppress(OSError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(exc.exit_code)      # cleanup is done; do not wait for a worker thread still in C++
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    except BrokenPipeError:                      # the reader went away (`nmt translate | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        typer.echo(f"error: {where}{exc.strerror or one_line(str(exc))}", err=True)
        code = 2
    except typer.Abort:
        code = 1
    except Exception as exc:
        if _is_user_error(exc):
            typer.echo(f"error: {one_line(str(exc))}", err=True)
            code = 2
        else:
            typer.echo(f"error: internal error ({type(exc).__name__}: {one_line(str(exc))[:300]}); "
                       "please report it", err=True)
            code = 1
    finally:
        gc.freeze()   # exit without a last garbage-collector walk over torch's objects: 0.3 s of every command
    sys.exit(code)

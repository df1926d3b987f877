"""`nmt evaluate` (sacreBLEU) and `nmt plot` (attention heatmaps, training curves)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from nmt.cli.common import MODEL_HELP, app, check_paths, fail, printable, user_errors
from nmt.fs.outputs import check_outputs, open_output, output_target


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
    beam_size: int | None = typer.Option(None, "--beam-size", min=1, help="With --checkpoint: its beam size."),
    device: str | None = typer.Option(None, "--device", help="With --checkpoint: auto, cpu or cuda[:N]."),
    bootstrap_samples: int | None = typer.Option(None, "--bootstrap-samples", min=10, max=100_000,
                                                 help="With --compare: resamples of the test (default 1000)."),
) -> None:
    """Score hypotheses (or a checkpoint's translations) with sacreBLEU BLEU and chrF.

    Only "\\n" ends a line (a "\\r" before it belongs to a CRLF ending). The signatures
    name the tokenizer, the case and the number of references.
    """
    import json

    from nmt import evaluate as ev

    translating = [name for name, value in (("--src", src), ("--beam-size", beam_size), ("--device", device))
                   if value is not None]
    if translating and checkpoint is None:
        fail(f"{translating[0]} applies only with --checkpoint, which translates --src first; --hyp is scored as is")
    if bootstrap_samples is not None and compare is None:
        fail("--bootstrap-samples applies only with --compare (the paired bootstrap test of two systems)")
    if json_out is not None and str(json_out) != "-":
        inputs = [("--hyp", hyp), ("--src", src), ("--compare", compare), *(("--ref", r) for r in ref)]
        check_paths({"--json": json_out}, inputs, [checkpoint] if checkpoint else [])
    with user_errors():
        ev.bleu_metric(tokenize, lowercase)               # a tokenizer that cannot run here: before any work
        refs = [ev.read_text(path) for path in ref]
        if checkpoint is not None:
            if src is None or hyp is not None:
                fail("--checkpoint needs --src (and no --hyp)")
            from nmt.decode.translator import Translator

            translator = Translator.load(checkpoint, device or "auto", beam_size=beam_size)
            hyps = [t.text for t in translator.translate_stream(ev.read_text(src))]
            hyp_name = f"{checkpoint} on {src}"
        elif hyp is not None:
            hyps, hyp_name = ev.read_text(hyp), str(hyp)
        else:
            fail("give --hyp FILE, or --checkpoint C --src FILE")
        systems = [(hyps, hyp_name)] + ([(ev.read_text(compare), str(compare))] if compare is not None else [])
        for lines, name in systems:
            for path, ref_lines in zip(ref, refs, strict=True):
                ev.check_lengths(lines, ref_lines, name, str(path))
        results = ev.score(hyps, refs, ter=ter, tokenize=tokenize, lowercase=lowercase)
        if compare is not None:
            results["comparison"] = ev.compare(hyps, systems[1][0], refs, ter=ter, samples=bootstrap_samples or 1000,
                                               tokenize=tokenize, lowercase=lowercase)
    ref_names = [str(path) for path in ref]
    references = ref_names[0] if len(ref_names) == 1 else ref_names      # a list only for several
    payload = json.dumps({"hypotheses": hyp_name, "references": references, **results}, indent=2)
    if json_out is not None and str(json_out) == "-":
        typer.echo(payload)
        return
    report = ev.format_report(results, printable(hyp_name), ", ".join(map(printable, ref_names)))
    typer.echo(report)                                    # first: a closed stdout fails first
    if json_out is not None:
        writer = open_output(output_target(json_out, "--json"))   # checked above; a link changed since is refused
        try:
            writer.handle.write(payload + "\n")
            writer.commit()
        finally:
            writer.discard()


plot_app = typer.Typer(help="Pictures: attention heatmaps and training curves (needs the plot extra: matplotlib).",
                       rich_markup_mode=None, no_args_is_help=True)
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
    from nmt.decode.outputs import OutputFiles
    from nmt.decode.translator import Translator
    from nmt.plot import attention_output, is_folder_target

    one_file = not is_folder_target(out)
    if one_file:
        check_paths({"--out": Path(out)}, models=[checkpoint])
    plotter = attention_output(out, len(src), "--out")
    translator = Translator.load(checkpoint, device, beam_size=beam_size)
    translator.write_translations(src, OutputFiles(sys.stdout, plotter=plotter))
    skipped = len(src) - len(plotter.written)          # an empty sentence has no attention to draw
    if one_file and skipped:
        fail(f"--src is empty: an empty sentence has no attention to draw; nothing was written to {out}")
    typer.echo(f"wrote {len(plotter.written)} heatmap(s) to {printable(out)}"
               + (f"; {skipped} empty sentence(s) have none" if skipped else ""), err=True)


@plot_app.command("curves")
def plot_curves_command(
    run_dirs: list[Path] = typer.Argument(..., help="Run folders (each with metrics.jsonl)."),
    out: Path = typer.Option(Path("curves.png"), "--out", "-o", help="The PNG to write."),
) -> None:
    """Draw train loss, dev perplexity and dev BLEU of one or more runs."""
    from nmt.plot import plot_curves

    inputs = [(str(run / name), run / name) for run in run_dirs for name in ("metrics.jsonl", "config.yaml")]
    check_outputs({"--out": out}, inputs)
    plot_curves(run_dirs, out)
    typer.echo(f"wrote {printable(out)}", err=True)

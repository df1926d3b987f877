"""`nmt average`, `nmt export` and `nmt info`: model files and checkpoints."""

from __future__ import annotations

from pathlib import Path

import typer

from nmt.cli.common import MODEL_HELP, app, check_paths, fail, printable, printable_data, printable_json
from nmt.config import ConfigError
from nmt.fs.folders import register_file
from nmt.fs.outputs import Identity, file_identity, output_target


@app.command()
def average(
    checkpoints: list[Path] = typer.Argument(..., help="Checkpoints of one run to average."),
    output: Path = typer.Option(..., "--output", "-o", help="The averaged checkpoint (in the same run folder)."),
) -> None:
    """Average the parameters of several checkpoints into a new one."""
    from nmt.train.checkpoint import average_checkpoints, save_checkpoint

    if output.exists():
        fail(f"{output} exists; choose a new name (checkpoints are never overwritten in place)")
    target = check_paths({"--output": output}, models=checkpoints)["--output"]
    _refuse_repeats(checkpoints)
    state = average_checkpoints(checkpoints)
    try:
        save_checkpoint(target, {k: v for k, v in state.items() if k not in ("format", "nmt_version")}, replace=False)
    except FileExistsError:
        fail(f"{output} was created by another process meanwhile; choose a new name")
    register_file(target)                   # `train --overwrite` may delete it with the rest of the run
    typer.echo(printable(f"averaged {len(checkpoints)} checkpoints into {output}"), err=True)


def _refuse_repeats(checkpoints: list[Path]) -> None:
    """Each checkpoint once, by real path and inode: a link or a hard link would weigh one checkpoint twice, and one
    file's "average" is a mislabelled copy."""
    seen: list[tuple[Path, Identity]] = []
    repeats: list[tuple[Path, Path]] = []
    for path in checkpoints:
        mine = file_identity(path)
        same = next((other for other, known in seen if known & mine), None)
        if same is None:
            seen.append((path, mine))
        else:
            repeats.append((path, same))
    if len(checkpoints) - len(repeats) < 2:
        named = ", ".join(dict.fromkeys(map(str, checkpoints)))
        fail(f"averaging needs at least two different checkpoints, got {named}; give several, e.g. RUN/best-step*.pt")
    if repeats:
        fail(f"{repeats[0][0]} is the same checkpoint as {repeats[0][1]}; each one counts once in an average")


@app.command()
def export(
    checkpoint: Path = typer.Argument(..., help="A training checkpoint (e.g. RUN/best.pt) or a model file."),
    output: Path = typer.Option(..., "--output", "-o",
                                help="The model file to write (model.nmt), or with --format hf or onnx a folder."),
    dtype: str = typer.Option("fp32", "--dtype", help="Weights stored as fp32, fp16 or bf16 (half the size)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing nmt model file (onnx: nmt's ONNX "
                                                      "folder) at --output."),
    quantize: str | None = typer.Option(None, "--quantize",
                                        help="int8: the file decodes with int8 products by default (CPU); "
                                             "onnx: int8 graphs (onnxruntime's dynamic quantization); none."),
    layout: str = typer.Option("nmt", "--format",
                               help="nmt: one model file; hf: a Hugging Face model folder (model.safetensors, "
                                    "config.json, SentencePiece models, README.md card); onnx: ONNX graphs "
                                    "and what a search on onnxruntime needs (nmt[onnx])."),
    score: list[str] | None = typer.Option(None, "--score", metavar="TESTSET=FILE",
                                           help="hf: a test set's `nmt evaluate --json` result, for the card's "
                                                "model-index, e.g. multi30k_test_2016_flickr=test.json "
                                                "(repeatable)."),
    card_license: str | None = typer.Option(None, "--license", help="hf: the card's license id (default unknown)."),
) -> None:
    """Write one self-contained model file (safetensors: weights without optimiser state, config,
    tokenizer, card), with --format hf a folder to share on the Hugging Face Hub, or with --format onnx
    a folder that translates on onnxruntime, without PyTorch."""
    from nmt.modelfile.file import DTYPES

    if dtype not in DTYPES:
        fail(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if layout not in ("nmt", "hf", "onnx"):
        fail(f"--format must be nmt, hf or onnx, got {layout!r}")
    given = [name for name, value in (("--score", score), ("--license", card_license)) if value]
    if given and layout != "hf":
        fail(f"{given[0]} applies only to --format hf (the model card of a Hugging Face folder)")
    try:
        if layout == "hf":
            message = _export_hf(checkpoint, output, dtype, quantize, force, score or [], card_license or "unknown")
        elif layout == "onnx":
            message = _export_onnx(checkpoint, output, dtype, quantize, force)
        else:
            message = _export_file(checkpoint, output, dtype, quantize, force)
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror or exc}")
    typer.echo(message, err=True)


def _export_file(checkpoint: Path, output: Path, dtype: str, quantize: str | None, force: bool) -> str:
    """`nmt export`: one model file, replacing only an nmt model file (with --force)."""
    from nmt.modelfile.card import describe, format_card
    from nmt.modelfile.file import ModelFileError, export_model, load_model

    if output.is_dir():
        fail(f"--output {output} is a folder; give a file name such as {output / 'model.nmt'} "
             "(or --format hf to write a Hugging Face folder)")
    if not output.parent.is_dir():
        fail(f"--output {output}: folder {output.parent} does not exist")
    target = check_paths({"--output": output}, models=[checkpoint])["--output"]
    replace = target.exists()           # --force replaces the nmt model file checked here, never one made meanwhile
    if replace:
        if not force:
            fail(f"{output} exists; choose a new name, or pass --force to replace an nmt model file")
        try:
            if load_model(target).kind != "model":
                raise ModelFileError("a checkpoint")
        except (ModelFileError, ConfigError):
            fail(f"{output} exists and is not an nmt model file; nmt replaces only its own model files")
    try:
        export_model(checkpoint, target, dtype, quantize, replace=replace)
    except FileExistsError:
        fail(f"{output} was created by another process meanwhile; choose a new name, or pass --force to replace "
             "an nmt model file")
    card = format_card(printable_data(describe(load_model(target))))
    return f"wrote {printable(output)} ({target.stat().st_size / 2**20:.1f} MB)\n\n{card}"


def _export_hf(checkpoint: Path, output: Path, dtype: str, quantize: str | None, force: bool, scores: list[str],
               card_license: str) -> str:
    """`nmt export --format hf`: a new folder in the Hugging Face layout (nmt.modelfile.hf)."""
    from nmt.modelfile.card import describe, format_card
    from nmt.modelfile.hf import export_hf, read_score

    if force:
        fail("--force applies only to --format nmt; --format hf writes only a new or empty folder")
    target = output_target(output, "--output")
    read = [read_score(option) for option in scores]
    card = format_card(printable_data(describe(export_hf(checkpoint, target, dtype, quantize, read, card_license))))
    size = (target / "model.safetensors").stat().st_size / 2**20
    return (f"wrote {printable(output)}/ (model.safetensors {size:.1f} MB, config.json, source.spm, target.spm, "
            f"vocab.json, README.md with {len(read)} test scores)\n\n{card}")


def _export_onnx(checkpoint: Path, output: Path, dtype: str, quantize: str | None, force: bool) -> str:
    """`nmt export --format onnx`: a folder of ONNX graphs (nmt.decode.onnx_export)."""
    if dtype != "fp32":
        fail(f"--dtype {dtype} does not apply to --format onnx: its graphs compute in float32 "
             "(--quantize int8 for int8 weights)")
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        fail("--format onnx needs the onnx extra: pip install 'nmt[onnx]' (onnx and onnxruntime)")
    from nmt.decode.onnx_export import export_onnx

    target = output_target(output, "--output")
    info = export_onnx(checkpoint, target, quantize or "none", force)
    size = sum(path.stat().st_size for path in target.iterdir()) / 2**20
    return printable(f"wrote {output}/ ({info['precision']} ONNX graphs for beam and greedy search, {size:.1f} MB)")


@app.command()
def info(
    model: Path = typer.Argument(..., help=MODEL_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print the card as JSON instead of Markdown."),
    allow_nonfinite: bool = typer.Option(False, "--allow-nonfinite", help="Show a model with NaN/inf weights."),
) -> None:
    """Show the model card: languages, vocabulary, parameters, data, scores (after checking the file)."""
    import json

    from nmt.modelfile.card import describe, format_card
    from nmt.modelfile.file import load_model

    card = describe(load_model(model, allow_nonfinite=allow_nonfinite))
    typer.echo(printable_json(json.dumps(card, indent=2, ensure_ascii=False)) if json_out
               else format_card(printable_data(card)))

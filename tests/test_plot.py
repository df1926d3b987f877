import itertools
import json
import struct
import subprocess
import sys

import pytest
import torch

from nmt.decode.translator import Translator

pytest.importorskip("matplotlib")

from nmt.plot import CURVES_SIZE, DPI, attention_figure, curves_figure, heatmap_size, read_metrics

from .conftest import link_marker, nmt_server


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return nmt_server().run(*args, text=True)


def test_plot_attention_cli_writes_pngs_of_expected_size(trained_run, tmp_path):
    sentences = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee neben einem großen Baum."]
    result = run_cli("plot", "attention", "--checkpoint", str(trained_run / "best.pt"), "--device", "cpu",
                     "--beam-size", "2", "--src", sentences[0], "--src", sentences[1], "-o", str(tmp_path))
    assert result.returncode == 0, result.stderr
    translator = Translator.from_checkpoint(trained_run / "best.pt", device="cpu", beam_size=2)
    results = translator.translate(sentences, return_attention=True)
    for i, res in enumerate(results):
        path = tmp_path / f"attention-{i:05d}.png"
        n_src, n_tgt = len(res.src_ids) + 1, len(res.hypotheses[0].tokens) + 1
        width, height = heatmap_size(n_src, n_tgt)
        assert png_size(path) == (round(width * DPI), round(height * DPI))


def test_attention_plots_never_replace_a_users_file(trained_run, tmp_path):
    args = ["plot", "attention", "--checkpoint", str(trained_run / "best.pt"), "--device", "cpu", "--src", "Ein Hund."]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "attention-00000.png").write_bytes(b"my holiday photo")
    result = run_cli(*args, "-o", str(mine))
    assert result.returncode == 2 and "holds files nmt did not write (attention-00000.png)" in result.stderr
    assert (mine / "attention-00000.png").read_bytes() == b"my holiday photo"
    ours = tmp_path / "ours"
    for sources in (["Ein Hund.", "Eine Katze."], ["", "Ein Mann."]):     # nmt's own folder: created, then replaced
        result = run_cli(*args[:-2], *[arg for src in sources for arg in ("--src", src)], "-o", str(ours))
        assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in ours.iterdir()) == [".nmt-folder.json", "attention-00001.png"]   # line 0: empty
    (ours / "notes.txt").write_text("mine now")
    assert run_cli(*args, "-o", str(ours)).returncode == 2


def test_heatmap_data_equals_model_attention(trained_run):
    translator = Translator.from_checkpoint(trained_run / "best.pt", device="cpu", beam_size=1, precision="fp32")
    result = translator.translate(["Eine Frau liest ein Buch im Park."], return_attention=True)[0]
    hyp = result.hypotheses[0]
    src_pieces = [*translator.src_vocab.to_pieces(result.src_ids), "</s>"]
    tgt_pieces = [*translator.tgt_vocab.to_pieces(hyp.tokens), "</s>"]
    # The weights the model gives when teacher-forced with its own output.
    model = translator.model
    src = torch.tensor([[*result.src_ids.tolist(), 3]])
    _, weights = model(src, torch.tensor([src.size(1)]), torch.tensor([[2, *hyp.tokens]]))
    fig = attention_figure(src_pieces, tgt_pieces, hyp.attention)
    drawn = torch.from_numpy(fig.axes[0].images[0].get_array().data.copy())
    assert drawn.shape == (len(tgt_pieces), len(src_pieces))            # padded columns absent
    assert torch.allclose(drawn, weights[0], atol=1e-5)
    assert torch.allclose(drawn.sum(-1), torch.ones(len(tgt_pieces)), atol=1e-5)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == src_pieces


def test_heatmap_fits_fifty_pieces():
    pieces = [f"▁w{i}" for i in range(50)]
    fig = attention_figure(pieces, pieces, torch.softmax(torch.randn(50, 50), -1))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    rows = [label.get_window_extent(renderer) for label in fig.axes[0].get_yticklabels()]
    for upper, lower in itertools.pairwise(rows):
        assert upper.y0 >= lower.y1 - 0.5 or lower.y0 >= upper.y1 - 0.5   # no overlap between neighbours
    columns = [label.get_window_extent(renderer) for label in fig.axes[0].get_xticklabels()]
    for left, right in itertools.pairwise(columns):
        assert right.x0 >= left.x1 - 0.5


def test_curves_from_metrics_with_missing_and_extra_fields(tmp_path):
    run = tmp_path / "run_a"
    run.mkdir()
    (run / "config.yaml").write_text("model:\n  attention: luong_general\n")
    events = [
        {"event": "train", "step": 10, "loss": 5.0, "wall_time": 1.0, "extra": [1, 2]},
        {"event": "train", "step": 20, "wall_time": 2.0},                        # no loss
        {"event": "validation", "step": 20, "ppl": 80.0, "bleu": 3.5, "wall_time": 2.5},
        {"event": "validation", "step": 40, "bleu": "n/a"},                      # wrong type, no ppl
        {"event": "something_new", "step": 41},
    ]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\nnot json\n")
    assert len(read_metrics(run)) == 5
    out = tmp_path / "curves.png"
    result = run_cli("plot", "curves", str(run), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert png_size(out) == (round(CURVES_SIZE[0] * DPI), round(CURVES_SIZE[1] * DPI))
    fig = curves_figure([run])
    assert fig.axes[0].get_legend().get_texts()[0].get_text() == "run_a (luong_general)"


def test_curves_refuse_an_unknown_format_and_skip_undecodable_lines(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_bytes(b'{"event": "train", "step": 1, "loss": 4.0, "wall_time": 1}\n'
                                        b'\xff\xfe cut by a crash\n')
    assert len(read_metrics(run)) == 1
    result = run_cli("plot", "curves", str(run), "-o", str(tmp_path / "curves.txt"))
    assert result.returncode == 2 and result.stderr.startswith("error: --out") and "Traceback" not in result.stderr
    assert not (tmp_path / "curves.txt").exists()
    old = tmp_path / "curves.svg"
    old.write_text("an older plot")
    assert run_cli("plot", "curves", str(run), "-o", str(old)).returncode == 0
    assert old.read_text().startswith("<?xml") and [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == []


def test_curves_name_a_metrics_file_that_is_a_fifo_or_a_folder(tmp_path):
    import os

    for kind, make in (("a FIFO (named pipe)", os.mkfifo), ("a folder", os.mkdir)):
        run = tmp_path / kind.split()[1]
        run.mkdir()
        make(run / "metrics.jsonl")
        result = run_cli("plot", "curves", str(run), "-o", str(tmp_path / "curves.png"))
        assert result.returncode == 2 and result.stderr == f"error: {run}/metrics.jsonl is {kind}, not a file\n"
        assert not (tmp_path / "curves.png").exists()


def test_curves_of_a_metrics_file_without_one_usable_line_are_refused(tmp_path):
    """Torn lines among good ones are skipped; a file of only such lines is an error naming it, not an empty chart."""
    run = tmp_path / "run"
    run.mkdir()
    out = tmp_path / "curves.png"
    for content in (b"[1, 2]\n", b"\xff\xfe\n", b'{"event": "train", "step": "3", "loss": 4.0}\n',
                    b'{"event": "validation", "step": 3, "bleu": "high", "wall_time": 1}\n', b""):
        (run / "metrics.jsonl").write_bytes(content)
        result = run_cli("plot", "curves", str(run), "-o", str(out))
        assert result.returncode == 2 and result.stderr == (
            f"error: {run}/metrics.jsonl: no line holds a training loss or a validation score with its step or time "
            "(nmt writes them as training runs); nothing to plot\n"), content
        assert not out.exists()
    (run / "metrics.jsonl").write_bytes(b'[1, 2]\n{"event": "train", "step": 3, "loss": 4.0}\n\xff\n')
    assert run_cli("plot", "curves", str(run), "-o", str(out)).returncode == 0 and out.is_file()


def test_curves_of_several_real_runs(trained_run, tmp_path):
    fig = curves_figure([trained_run, trained_run])
    assert len(fig.axes[0].get_lines()) == 2
    xs = fig.axes[2].get_lines()[0].get_xdata()                              # dev BLEU against updates
    assert list(xs) == [20, 40]


def test_without_matplotlib_plot_commands_say_how_to_install(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None; from nmt.cli.main import main; "
            f"sys.argv = ['nmt', 'plot', 'curves', {str(tmp_path)!r}]; main()")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: plotting needs matplotlib: pip install 'nmt[plot]'"


def test_other_commands_do_not_import_matplotlib():
    code = ("import sys; import nmt.cli.main, nmt.decode.translator, nmt.train.trainer, nmt.evaluate; "
            "print('matplotlib' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_plot_attention_counts_only_the_heatmaps_it_wrote(trained_run, tmp_path):
    out = tmp_path / "attention"
    result = run_cli("plot", "attention", "--checkpoint", str(trained_run / "best.pt"), "--device", "cpu",
                     "--src", "", "--src", "Ein Hund.", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.glob("*.png")) == ["attention-00001.png"]
    assert f"wrote 1 heatmap(s) to {out}; 1 empty sentence(s) have none" in result.stderr


def test_an_attention_folder_whose_marker_is_a_link_is_refused(trained_run, tmp_path):
    out = tmp_path / "attention"
    victim = link_marker(out)
    for args in (["plot", "attention", "--src", "Ein Hund.", "-o", str(out)],
                 ["translate", "--plot-attention", str(out)]):
        result = run_cli(*args[:1 if args[0] == "translate" else 2], "--checkpoint", str(trained_run / "best.pt"),
                         *args[1 if args[0] == "translate" else 2:])
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and "is a symbolic link" in lines[0], result.stderr
    assert victim.read_text() == "mine\n" and [p.name for p in out.iterdir()] == [".nmt-folder.json"]


def test_plot_attention_to_an_image_file_writes_that_file(trained_run, tmp_path):
    args = ["plot", "attention", "--checkpoint", str(trained_run / "best.pt"), "--device", "cpu"]
    png = tmp_path / "att.png"
    result = run_cli(*args, "--src", "Ein Hund läuft.", "-o", str(png))
    assert result.returncode == 0, result.stderr
    assert png.is_file() and png_size(png)[0] > 0 and f"wrote 1 heatmap(s) to {png}" in result.stderr
    pdf = tmp_path / "att.pdf"
    result = run_cli(*args, "--src", "Ein Hund läuft.", "-o", str(pdf))
    assert result.returncode == 0 and pdf.read_bytes().startswith(b"%PDF"), result.stderr
    png.write_bytes(b"an older heatmap")                          # a file named again is replaced whole
    assert run_cli(*args, "--src", "Eine Katze.", "-o", str(png)).returncode == 0
    png_size(png)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["att.pdf", "att.png"]     # no temporaries left


def test_plot_attention_file_or_folder_by_the_path(trained_run, tmp_path):
    args = ["plot", "attention", "--checkpoint", str(trained_run / "best.pt"), "--device", "cpu"]

    def error(*more: str) -> str:
        result = run_cli(*args, *more)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        return lines[0]

    line = error("--src", "Ein Hund.", "--src", "Eine Katze.", "-o", str(tmp_path / "att.png"))
    assert "names one file, but 2 sentences were given" in line and f"{tmp_path / 'att'}/" in line
    assert "cannot write .xyz" in error("--src", "Ein Hund.", "-o", str(tmp_path / "att.xyz"))
    line = error("--src", "", "-o", str(tmp_path / "empty.png"))
    assert "an empty sentence has no attention to draw" in line
    assert list(tmp_path.iterdir()) == []
    slash = tmp_path / "heat.maps"                                  # a trailing slash: a folder, suffix or not
    result = run_cli(*args, "--src", "Ein Hund.", "--src", "Eine Katze.", "-o", f"{slash}/")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in slash.glob("*.png")) == ["attention-00000.png", "attention-00001.png"]
    existing = tmp_path / "old.png"                                  # an existing folder stays a folder
    existing.mkdir()
    assert run_cli(*args, "--src", "Ein Hund.", "-o", str(existing)).returncode == 0
    assert (existing / "attention-00000.png").is_file()

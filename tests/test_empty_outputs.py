"""An undertrained model's searches prefer the empty output. By default (decoding.min_len 1) no search gives
one for a non-empty line; with --min-len 0 they may, and when most lines translate to nothing, one warning
on stderr says so, instead of a silent BLEU of 0.00."""

from __future__ import annotations

import pytest
import torch

from nmt.config import DecodingConfig, ModelConfig, load_config
from nmt.data.folder import DataFolder
from nmt.data.special import EOS
from nmt.decode.translator import Translator
from nmt.model.seq2seq import Seq2Seq

LINES = ["Ein Hund läuft durch das Gras.", "", "Zwei Männer spielen Fußball.", "Kinder"]


def eos_first_translator(prepared, **decoding) -> Translator:
    """A random model whose most probable first token is EOS, by far."""
    data = DataFolder.open(load_config(prepared).data.out_dir)
    src_vocab, tgt_vocab = data.vocab("src"), data.vocab("tgt")
    torch.manual_seed(0)
    model = Seq2Seq.from_config(ModelConfig(embedding_dim=16, encoder_hidden=16, decoder_hidden=32, attention_dim=16,
                                            dropout=0.0), len(src_vocab), len(tgt_vocab))
    with torch.no_grad():
        model.decoder.output.bias[EOS] += 30.0
    return Translator(model, src_vocab, tgt_vocab, DecodingConfig(precision="fp32", **decoding), torch.device("cpu"))


@pytest.mark.parametrize("decoding", [{"beam_size": 1}, {"beam_size": 4}, {"sampling": True}])
def test_no_line_translates_to_nothing_by_default_and_nothing_is_said(prepared, capsys, decoding):
    out = [t.text for t in eos_first_translator(prepared, **decoding).translate_stream(LINES)]
    assert len(out) == len(LINES) and out[1] == ""
    assert all(text.strip() for i, text in enumerate(out) if i != 1)
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("decoding", [{"beam_size": 1}, {"beam_size": 4}, {"sampling": True}])
def test_min_len_0_allows_empty_outputs_and_most_of_them_empty_is_one_warning(prepared, capsys, decoding):
    out = [t.text for t in eos_first_translator(prepared, min_len=0, **decoding).translate_stream(LINES)]
    assert out == [""] * len(LINES)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: 3 of 3 non-empty input lines translated to empty lines; the model may be "
                        "undertrained (train longer); --min-len 1 forbids empty outputs"]

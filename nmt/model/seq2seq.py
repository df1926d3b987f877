"""The sequence-to-sequence model, built from the `model` section of the config."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from nmt.config import ConfigError, ModelConfig
from nmt.data.special import PAD
from nmt.model.attention import Memory, build_attention
from nmt.model.bahdanau import BahdanauDecoder
from nmt.model.decoder import Decoder, DecoderState
from nmt.model.encoder import Encoder, EncoderOutput
from nmt.model.luong import LuongDecoder


class Bridge(nn.Module):
    """Initial decoder state from the encoder's final state: s_0 = tanh(W_b [→h_n; ←h_1]), or zeros."""

    def __init__(self, kind: str, enc_size: int, dec_hidden: int, dec_layers: int, is_lstm: bool) -> None:
        super().__init__()
        self.kind, self.dec_hidden, self.dec_layers = kind, dec_hidden, dec_layers
        if kind == "bridge":
            self.hidden = nn.Linear(enc_size, dec_hidden * dec_layers)
            self.cell = nn.Linear(enc_size, dec_hidden * dec_layers) if is_lstm else None
        self.is_lstm = is_lstm

    def _project(self, layer: nn.Linear, final: Tensor) -> Tensor:
        batch = final.size(0)
        projected = torch.tanh(layer(final))                                        # (batch, layers*dec_hidden)
        return projected.view(batch, self.dec_layers, self.dec_hidden).transpose(0, 1).contiguous()

    def forward(self, encoded: EncoderOutput) -> tuple[Tensor, Tensor | None]:
        """returns hidden (layers, batch, dec_hidden) and, for LSTM, cell of the same shape."""
        final = encoded.final
        if self.kind == "zero":
            zeros = final.new_zeros(self.dec_layers, final.size(0), self.dec_hidden)
            return zeros, (zeros.clone() if self.is_lstm else None)
        hidden = self._project(self.hidden, final)
        cell = None if self.cell is None or encoded.final_cell is None else self._project(self.cell, encoded.final_cell)
        return hidden, cell


class Seq2Seq(nn.Module):
    def __init__(self, encoder: Encoder, bridge: Bridge, decoder: Decoder) -> None:
        super().__init__()
        self.encoder, self.bridge, self.decoder = encoder, bridge, decoder

    @classmethod
    def from_config(cls, config: ModelConfig, src_vocab: int, tgt_vocab: int, initialize: bool = True) -> Seq2Seq:
        """`initialize=False` skips `config.init`, for weights about to be loaded (a third of the build time)."""
        encoder = Encoder(src_vocab, config.embedding_dim, config.encoder_hidden, config.encoder_layers,
                          config.bidirectional, config.rnn_type, config.dropout)
        try:
            attention = build_attention(config.attention, config.decoder_hidden, encoder.output_size,
                                        config.attention_dim)
        except ValueError as exc:
            raise ConfigError(f"`model.attention`: {exc}") from None
        common: dict[str, Any] = dict(
            vocab_size=tgt_vocab, embedding_dim=config.embedding_dim, hidden=config.decoder_hidden,
            layers=config.decoder_layers, rnn_type=config.rnn_type, attention=attention,
            context_size=encoder.output_size, dropout=config.dropout)
        if config.attention == "bahdanau":
            decoder: Decoder = BahdanauDecoder(**common)
        else:
            decoder = LuongDecoder(**common, input_feeding=config.input_feeding)
        if config.tie_embeddings:
            if config.embedding_dim != config.decoder_hidden:
                raise ConfigError(f"`model.tie_embeddings` needs model.embedding_dim ({config.embedding_dim}) "
                                  f"equal to model.decoder_hidden ({config.decoder_hidden})")
            decoder.output.weight = decoder.embed.weight
        bridge = Bridge(config.bridge, encoder.output_size, config.decoder_hidden, config.decoder_layers,
                        config.rnn_type == "lstm")
        model = cls(encoder, bridge, decoder)
        if initialize and config.init == "uniform":  # as OpenNMT's param_init: U(-0.1, 0.1), every parameter (but W_f)
            for parameter in model.parameters():
                nn.init.uniform_(parameter, -config.init_scale, config.init_scale)
        if initialize and isinstance(decoder, LuongDecoder):
            decoder.zero_feed_weights()
        return model

    def encode(self, src: Tensor, src_lengths: Tensor) -> tuple[Memory, DecoderState]:
        encoded = self.encoder(src, src_lengths)
        memory = self.decoder.memory(encoded.outputs, src != PAD)
        hidden, cell = self.bridge(encoded)
        return memory, self.decoder.initial_state(hidden, cell)

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, teacher_forcing: float = 1.0,
                features_only: bool = False) -> tuple[Tensor, Tensor]:
        """-> logits (batch, tgt_len, tgt_vocab) (or features, `Decoder.forward`), weights (batch, tgt_len, src_len)."""
        memory, state = self.encode(src, src_lengths)
        return self.decoder(tgt_in, state, memory, teacher_forcing, features_only)

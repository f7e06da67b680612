"""Image captioning host: frozen grid features -> (optional self-attention encoder) -> transformer decoder.

The variant is every attention of the model: the encoder's self-attention over the grid, and the decoder's
causal self-attention and its cross-attention to the grid (the BAM and alignment-attention papers swap the
attention of such a decoder). Decoding is greedy or beam search; both recompute the whole prefix at each
step instead of caching keys and values, which keeps every variant (some normalise over all keys of a
query at once, or iterate on the values) exact, at a cost that is small for 20-word captions.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import DenseGroups
from .attention_layers import Trace, TransformerLayer, sinusoidal_positions


class Captioner(nn.Module):
    def __init__(self, vocab_size: int, feature_dim: int, attention: str | Mapping[str, Any], *, pad_id: int, bos_id: int,
                 eos_id: int, width: int = 256, heads: int = 4, depth: int = 2, encoder_depth: int = 0, dropout: float = 0.1):
        super().__init__()
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.width = width
        self.project = nn.Sequential(nn.Linear(feature_dim, width), nn.LayerNorm(width), nn.Dropout(dropout))
        # The encoder's self-attention runs over the image grid (a set of cells, no token order).
        self.encoder = nn.ModuleList(
            TransformerLayer(width, heads, attention, sequence=False, dropout=dropout) for _ in range(encoder_depth)
        )
        self.embed = nn.Embedding(vocab_size, width, padding_idx=pad_id)
        # Scaled so that the tied output layer starts with unit-scale logits (Vaswani et al. multiply the
        # embeddings by sqrt(width) for the same reason).
        nn.init.normal_(self.embed.weight, std=width**-0.5)
        with torch.no_grad():
            self.embed.weight[pad_id].zero_()
        # Causal self-attention over the caption's tokens, then cross-attention from the caption to the grid.
        self.decoder = nn.ModuleList(
            TransformerLayer(width, heads, attention, sequence=True, cross=True, dropout=dropout) for _ in range(depth)
        )
        self.drop = nn.Dropout(dropout)
        self.output_bias = nn.Parameter(torch.zeros(vocab_size))
        """The output layer is the transposed word embedding (tied, Press & Wolf 2017) plus this bias."""

    def encode(self, features: Tensor, trace: Trace | None = None, *, need_weights: bool = False) -> tuple[Tensor, DenseGroups]:
        """Grid features [B, N, C] -> memory [B, N, width] and the groups that cross-attention uses on it."""
        memory = self.project(features)
        # Every grid cell is a real key; the groups still carry a mask so that mask-aware variants see one.
        groups = DenseGroups.from_key_padding(torch.ones(memory.shape[:2], dtype=torch.bool, device=memory.device))
        for layer in self.encoder:
            memory = layer(memory, groups, trace, need_weights=need_weights)
        return memory, groups

    def decode(self, tokens: Tensor, memory: Tensor, memory_groups: DenseGroups, trace: Trace | None = None, *,
               need_weights: bool = False) -> Tensor:
        """Tokens [B, L] (starting with <bos>, right-padded) -> next-word logits [B, L, vocab]."""
        length = tokens.shape[1]
        positions = sinusoidal_positions(length, self.width).to(memory.device, memory.dtype)
        x = self.drop(self.embed(tokens) * math.sqrt(self.width) + positions)
        real = tokens != self.pad_id
        groups = DenseGroups.from_key_padding(real, causal=True, query_valid=real)
        # Padded caption positions are no queries of the cross-attention either.
        cross_groups = DenseGroups(memory_groups.mask, query_valid=real)
        for layer in self.decoder:
            x = layer(x, groups, trace, context=memory, context_groups=cross_groups, need_weights=need_weights)
        return F.linear(x, self.embed.weight, self.output_bias)

    def forward(self, features: Tensor, tokens: Tensor, trace: Trace | None = None, *, need_weights: bool = False) -> Tensor:
        """Teacher forcing: logits [B, L, vocab] of the word after each of `tokens` [B, L]."""
        memory, groups = self.encode(features, trace, need_weights=need_weights)
        return self.decode(tokens, memory, groups, trace, need_weights=need_weights)

    def _next_log_probs(self, tokens: Tensor, memory: Tensor, groups: DenseGroups) -> Tensor:
        logits = self.decode(tokens, memory, groups)[:, -1].float()
        # A caption never continues with <pad> or <bos>; they get no probability, and the others keep their
        # model log-probabilities (so scores are log p(caption) under the model).
        logp = logits.log_softmax(-1)
        logp[:, [self.pad_id, self.bos_id]] = float("-inf")
        return logp

    @torch.no_grad()
    def greedy(self, features: Tensor, max_len: int) -> Tensor:
        """The most likely next word at every step: [B, T] word ids (no <bos>), <pad> after each <eos>."""
        memory, groups = self.encode(features)
        tokens = torch.full((features.shape[0], 1), self.bos_id, dtype=torch.long, device=features.device)
        finished = torch.zeros(features.shape[0], dtype=torch.bool, device=features.device)
        for _ in range(max_len):
            word = self._next_log_probs(tokens, memory, groups).argmax(-1)
            word = word.masked_fill(finished, self.pad_id)
            tokens = torch.cat([tokens, word[:, None]], 1)
            finished |= word == self.eos_id
            if finished.all():
                break
        return tokens[:, 1:]

    @torch.no_grad()
    def beam_search(self, features: Tensor, beam_size: int, max_len: int, length_penalty: float = 0.0) -> tuple[Tensor, Tensor]:
        """Beam search, batched over images and beams: (captions [B, K, T] best first, <pad> after each <eos>;
        their scores [B, K]: log p(caption) / length**length_penalty, length counting the <eos>).

        Written here because the beam searches of libraries (transformers' generate, fairseq, torchaudio's
        CTC decoders) are bound to their own model classes; this one needs only `decode`. A finished beam
        stays in the beam with its score, continuing with <pad> at no cost, so it competes with the open
        beams until the end. Captions that reach max_len without <eos> are returned as they are."""
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        batch, device = features.shape[0], features.device
        memory, groups = self.encode(features)
        memory = memory.repeat_interleave(beam_size, 0)
        groups = DenseGroups.from_key_padding(torch.ones(memory.shape[:2], dtype=torch.bool, device=device))
        tokens = torch.full((batch * beam_size, 1), self.bos_id, dtype=torch.long, device=device)
        # All beams start as the same <bos>: only the first may expand, or the beam would fill with copies.
        scores = torch.full((batch, beam_size), float("-inf"), device=device)
        scores[:, 0] = 0.0
        finished = torch.zeros(batch, beam_size, dtype=torch.bool, device=device)
        lengths = torch.zeros(batch, beam_size, dtype=torch.long, device=device)
        offsets = torch.arange(batch, device=device)[:, None] * beam_size
        for _ in range(max_len):
            logp = self._next_log_probs(tokens, memory, groups).view(batch, beam_size, -1)
            vocab = logp.shape[-1]
            pad_only = torch.full_like(logp[0, 0], float("-inf"))
            pad_only[self.pad_id] = 0.0
            logp = torch.where(finished[..., None], pad_only, logp)
            scores, flat = (scores[..., None] + logp).view(batch, -1).topk(beam_size, dim=-1)
            beam, word = flat // vocab, flat % vocab
            tokens = torch.cat([tokens[(beam + offsets).view(-1)], word.view(-1, 1)], 1)
            was_finished = finished.gather(1, beam)
            lengths = lengths.gather(1, beam) + (~was_finished).long()
            finished = was_finished | (word == self.eos_id)
            if finished.all():
                break
        if length_penalty:
            scores = scores / lengths.clamp_min(1).float() ** length_penalty
        scores, order = scores.sort(-1, descending=True)
        captions = tokens[:, 1:].view(batch, beam_size, -1)
        return captions.gather(1, order[..., None].expand_as(captions)), scores

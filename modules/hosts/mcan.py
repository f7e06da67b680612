"""MCAN (Yu et al., CVPR 2019, "Deep Modular Co-Attention Networks for VQA") in its encoder-decoder form,
with every attention (question self-attention, image self- and guided attention, both poolings) the variant.

question words -> embedding + sinusoidal positions -> `depth` SA layers (encoder)
image grid -> Linear + LayerNorm + learned row/column positions -> `depth` SGA layers guided by the
encoded question (decoder) -> attentional pooling of both streams -> sum of projections -> LayerNorm
-> answer logits.

Differences from the paper, kept small on purpose: sinusoidal positions instead of MCAN's LSTM over GloVe
vectors (no pretrained word vectors offline; positions let the SA layers read word order), grid features
with learned 2-D positions instead of bottom-up region features, and AttFlat's MLP scorer replaced by
`AttentionPool` so that pooling is the variant too.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import Tensor, nn

from ..attention import AttentionKernel, DenseGroups
from .attention_layers import AttentionPool, Trace, TransformerLayer, sinusoidal_positions, variant_kernels


class MCAN(nn.Module):
    def __init__(self, attention: str | Mapping[str, Any], *, vocab_size: int, image_channels: int, grid_size: tuple[int, int],
                 num_answers: int, width: int = 128, heads: int = 4, depth: int = 2, dropout: float = 0.1):
        super().__init__()
        self.width = width
        self.grid_size = tuple(grid_size)
        self.embed = nn.Embedding(vocab_size, width, padding_idx=0)
        self.image_proj = nn.Sequential(nn.Linear(image_channels, width), nn.LayerNorm(width))
        rows, cols = self.grid_size
        self.row_positions = nn.Parameter(torch.randn(rows, 1, width) * 0.02)
        self.col_positions = nn.Parameter(torch.randn(1, cols, width) * 0.02)
        self.drop = nn.Dropout(dropout)
        # Encoder: self-attention over the question's words; decoder: self-attention over the image grid (a
        # set of cells) and image -> question guided (cross) attention; then attentional pooling of both.
        self.encoder = nn.ModuleList(
            TransformerLayer(width, heads, attention, sequence=True, cross=False, dropout=dropout) for _ in range(depth)
        )
        self.decoder = nn.ModuleList(
            TransformerLayer(width, heads, attention, sequence=False, cross=True, dropout=dropout) for _ in range(depth)
        )
        self.pool_question = AttentionPool(width, heads, attention, dropout=dropout)
        self.pool_image = AttentionPool(width, heads, attention, dropout=dropout)
        # MCAN fuses into a space twice the model width (512 -> 1024) before the classifier.
        self.fuse_question = nn.Linear(width, 2 * width)
        self.fuse_image = nn.Linear(width, 2 * width)
        self.fuse_norm = nn.LayerNorm(2 * width)
        self.classifier = nn.Linear(2 * width, num_answers)

    def forward(self, question: Tensor, question_valid: Tensor, image: Tensor, trace: Trace | None = None, *,
                need_weights: bool = False) -> Tensor:
        """question [B, L] ids, question_valid [B, L] (True = word), image [B, rows*cols, C] -> logits [B, A]."""
        rows, cols = self.grid_size
        if image.shape[1] != rows * cols:
            raise ValueError(f"image grid has {image.shape[1]} tokens; the model was built for {rows}x{cols}")
        q = self.embed(question) + sinusoidal_positions(question.shape[1], self.width).to(image.device)
        q = self.drop(q)
        v = self.drop(self.image_proj(image) + (self.row_positions + self.col_positions).reshape(1, rows * cols, -1))
        # padded words are neither keys nor queries of the question's self-attention; image cells query them
        question_groups = DenseGroups.from_key_padding(question_valid, query_valid=question_valid)
        guided_groups = DenseGroups.from_key_padding(question_valid)
        image_groups = DenseGroups.from_key_padding(torch.ones(image.shape[:2], dtype=torch.bool, device=image.device))
        for layer in self.encoder:
            q = layer(q, question_groups, trace, need_weights=need_weights)
        for layer in self.decoder:
            v = layer(v, image_groups, trace, context=q, context_groups=guided_groups, need_weights=need_weights)
        pooled_q = self.pool_question(q, question_valid, trace, need_weights=need_weights)
        pooled_v = self.pool_image(v, image_groups.mask[:, 0, 0], trace, need_weights=need_weights)
        return self.classifier(self.fuse_norm(self.fuse_question(pooled_q) + self.fuse_image(pooled_v)))

    def kernels(self) -> list[AttentionKernel]:
        return variant_kernels(self)

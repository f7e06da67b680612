"""The transformers model families checked with every variant, each as the tiny configuration the checks build.

This table is what "supported" means in this package: tests/modules/test_hf_families.py runs its checks in every
family listed here (softmax through attnbench equals the model's own eager attention, kernels at the sites the
layers imply, the refusals), and a refused model's message names these families. A family enters the list by
being added here, where the tests pick it up; nothing else lists families by hand.

Other models whose attention layers go through transformers' attention interface with nothing of their own on
top are accepted too (support.py decides); they are just not in this checked list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

TINY = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64)
VOCAB = 60


@dataclass(frozen=True)
class Family:
    """One checked family: how the checks build its tiny model and what it reads."""

    config: Callable[[], Any]
    """A tiny configuration (random weights, eager attention) of the family."""
    model: str = "AutoModel"
    """The transformers class, by name, the checks build from it."""
    inputs: str = "tokens"
    """'tokens' (input_ids and a padding mask), 'image' (pixel_values), 'tokens+image', 'audio' (input_features
    with decoder tokens) or 'seq2seq' (input_ids with decoder tokens)."""
    causal: bool = False
    """A decoder-only language model (generate works with and without the cache)."""


def _config(name: str, **fields: Any) -> Callable[[], Any]:
    def build():
        import transformers

        return getattr(transformers, name)(attn_implementation="eager", **fields)

    return build


FAMILIES: dict[str, Family] = {
    "albert": Family(_config("AlbertConfig", vocab_size=VOCAB, embedding_size=16, num_hidden_layers=3, **TINY)),
    "bart": Family(_config("BartConfig", vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                           decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32),
                   model="BartForConditionalGeneration", inputs="seq2seq"),
    "bert": Family(_config("BertConfig", vocab_size=VOCAB, num_hidden_layers=2, **TINY)),
    "clip": Family(_config("CLIPConfig", projection_dim=16,
                           text_config=dict(vocab_size=VOCAB, num_hidden_layers=1, max_position_embeddings=32, bos_token_id=1,
                                            eos_token_id=2, pad_token_id=0, **TINY),
                           vision_config=dict(image_size=16, patch_size=4, num_hidden_layers=1, **TINY)),
                   model="CLIPModel", inputs="tokens+image"),
    "distilbert": Family(_config("DistilBertConfig", vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64)),
    "electra": Family(_config("ElectraConfig", vocab_size=VOCAB, embedding_size=16, num_hidden_layers=2, **TINY)),
    "gpt2": Family(_config("GPT2Config", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32), model="GPT2LMHeadModel",
                   causal=True),
    "llama": Family(_config("LlamaConfig", vocab_size=VOCAB, num_hidden_layers=2, num_key_value_heads=2, **TINY),
                    model="LlamaForCausalLM", causal=True),
    "mistral": Family(_config("MistralConfig", vocab_size=VOCAB, num_hidden_layers=2, num_key_value_heads=2, sliding_window=4, **TINY),
                      model="MistralForCausalLM", causal=True),
    "qwen2": Family(_config("Qwen2Config", vocab_size=VOCAB, num_hidden_layers=2, num_key_value_heads=2, **TINY),
                    model="Qwen2ForCausalLM", causal=True),
    "roberta": Family(_config("RobertaConfig", vocab_size=VOCAB, pad_token_id=1, num_hidden_layers=2, **TINY)),
    "vit": Family(_config("ViTConfig", image_size=16, patch_size=4, num_hidden_layers=2, **TINY), inputs="image"),
    "whisper": Family(_config("WhisperConfig", vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                              decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=8,
                              max_target_positions=16, decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2),
                      model="WhisperForConditionalGeneration", inputs="audio"),
}
"""model_type -> the family as the checks build it."""


def checked_families() -> list[str]:
    """The model types of the checked families, sorted: what refusals name as supported."""
    return sorted(FAMILIES)

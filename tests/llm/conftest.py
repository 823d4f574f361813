"""Tiny random-weight Hugging Face models for every family, built with transformers and saved to
temporary folders (with a small byte-level BPE tokenizer and a ChatML chat template)."""

import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB = 320
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TEXT = ["The quick brown fox jumps over the lazy dog.", "Hello world! How are you today?",
        "Express runs language models on small devices.", "naïve café, 東京, emoji 🙂 and more"] * 20

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)

FAMILIES = {
    "llama": (transformers.LlamaConfig, dict(rope_theta=10000.0)),
    "llama3": (transformers.LlamaConfig, dict(
        rope_theta=500000.0, attention_bias=True, tie_word_embeddings=True,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=64))),
    "qwen2": (transformers.Qwen2Config, dict(tie_word_embeddings=True)),
    "qwen3": (transformers.Qwen3Config, dict(head_dim=32, tie_word_embeddings=False)),
    "mistral": (transformers.MistralConfig, dict(sliding_window=None, head_dim=16)),
    "glm4": (transformers.Glm4Config, dict(head_dim=16, partial_rotary_factor=0.5, pad_token_id=0)),
}
MODEL_CLASSES = {"llama": transformers.LlamaForCausalLM, "llama3": transformers.LlamaForCausalLM,
                 "qwen2": transformers.Qwen2ForCausalLM, "qwen3": transformers.Qwen3ForCausalLM,
                 "mistral": transformers.MistralForCausalLM, "glm4": transformers.Glm4ForCausalLM}


def make_tokenizer():
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 8, special_tokens=["<pad>", "<s>", "</s>", "<|im_start|>",
                                                                        "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TEXT, trainer)
    return tok


def build(family, folder, seed=0, **over):
    cls, extra = FAMILIES[family]
    cfg = cls(**{**BASE, **extra, **over})
    torch.manual_seed(seed)
    model = MODEL_CLASSES[family](cfg).eval()
    with torch.no_grad():  # larger random weights than the init so differences show
        for p in model.parameters():
            p.normal_(0, 0.2 if p.ndim > 1 else 0.5)
    model.save_pretrained(folder, safe_serialization=True)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=make_tokenizer(), bos_token="<s>",
                                                eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHATML
    fast.save_pretrained(folder)
    return model


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """family -> (folder, transformers model), built once per session."""
    cache = {}

    def get(family):
        if family not in cache:
            folder = str(tmp_path_factory.mktemp(family))
            cache[family] = (folder, build(family, folder))
        return cache[family]
    return get

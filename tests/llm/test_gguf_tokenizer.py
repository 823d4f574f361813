"""The compact SentencePiece encoder of the real Gemma 3 vocabulary against the `tokenizers`
object built from the same GGUF vocabulary, and against llama.cpp's tokenizer where installed."""
import random

import pytest

from llm.gguf import GGUFFile, compact_tokenizer_from_gguf, default_model_path, tokenizer_from_gguf
from llm.tokenizer import StreamDetokenizer, Tokenizer

TEXTS = ["Hello, world!", "  leading spaces and    runs   ", "tabs\t\tand\n\nnew paragraphs\n\n\n",
         "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n", "<bos>text<eos> <unused5> <pad>",
         "日本語のテキスト、中文，한국어 🤖🧠 emoji 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🏳️‍🌈", "\x00\x01 control \u200b zero width x\u00a0y",
         "def f(x):\n    return x**2  # code\n", "a" * 60, "ÀÉÎÕÜ ñ ß ø Ｆｕｌｌｗｉｄｔｈ", "", " ", "1234567890 3.14159 -42",
         "[multimodal] <start_of_image>"]


@pytest.fixture(scope="module")
def toks():
    g = GGUFFile(default_model_path())
    return tokenizer_from_gguf(g), compact_tokenizer_from_gguf(g)


def _random_texts(n=300):
    rng = random.Random(0)
    alpha = "abc de\n\t日é🤖<>_.,!?'\"0123 \u2581"
    return ["".join(rng.choice(alpha) for _ in range(rng.randint(1, 80))) for _ in range(n)]


def test_encode_matches_tokenizers(toks):
    ref, ours = toks
    for s in TEXTS + _random_texts():
        for special in (True, False):
            assert ours.encode(s, add_special_tokens=special).ids == ref.encode(s, add_special_tokens=special).ids, s


def test_decode_matches_tokenizers(toks):
    ref, ours = toks
    for s in TEXTS:
        ids = ref.encode(s).ids
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)
    rng = random.Random(1)
    for _ in range(300):  # arbitrary ids, byte pieces that do not form UTF-8 included
        ids = [rng.randrange(ours.get_vocab_size()) for _ in range(rng.randint(1, 8))]
        ids += [ours.token_to_id(f"<0x{rng.choice([0xF0, 0x9F, 0x41, 0xE6]):02X}>") for _ in range(rng.randint(0, 3))]
        assert ours.decode(ids) == ref.decode(ids), ids
    with pytest.raises(Exception, match="out of range"):
        ours.decode([ours.get_vocab_size()])


def test_stream_detokenizer_utf8(toks):
    _, ours = toks
    tok = Tokenizer.from_tokenizer(ours, {})
    text = "Emoji 🤖 and 日本語 in a stream 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 done."
    ids = ours.encode(text, add_special_tokens=False).ids
    d = StreamDetokenizer(tok)
    out = "".join(d.add(i) for i in ids) + d.flush()
    assert out == text and "\ufffd" not in out


def test_matches_llama_cpp(toks):
    llama_cpp = pytest.importorskip("llama_cpp")
    _, ours = toks
    m = llama_cpp.Llama(model_path=default_model_path(), vocab_only=True, verbose=False)
    for s in TEXTS:
        want = m.tokenize(s.encode("utf-8"), add_bos=True, special=True)
        assert ours.encode(s).ids == want, s


class _Meta:
    """GGUF metadata alone, for the tokenizer's checks of it"""
    path = "bad.gguf"

    def __init__(self, **kv):
        self.kv = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "a", "b", "ab"],
                   "tokenizer.ggml.token_type": [2, 3, 1, 1, 1], "tokenizer.ggml.scores": [0.0] * 5,
                   "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.add_bos_token": True}
        self.kv.update(kv)

    def get(self, key, default=None):
        return self.kv.get(key, default)


@pytest.mark.parametrize("kv, message", [
    ({"tokenizer.ggml.tokens": []}, "no embedded tokenizer"),
    ({"tokenizer.ggml.scores": [0.0] * 4}, "differ in length"),
    ({"tokenizer.ggml.token_type": [2, 3, 1, 1, 300]}, "unknown type"),
    ({"tokenizer.ggml.bos_token_id": 9}, "bos_token_id 9 is out of range"),
])
def test_bad_vocabulary_metadata(kv, message):
    from express import ModelError
    with pytest.raises(ModelError, match=f"bad.gguf: .*{message}"):
        compact_tokenizer_from_gguf(_Meta(**kv))


def test_small_vocabulary_merges_by_score():
    tok = compact_tokenizer_from_gguf(_Meta())
    assert tok.encode("abba").ids == [1, 4, 3, 2]
    assert tok.decode([1, 4, 3, 2]) == "abba"

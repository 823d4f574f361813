"""Real-architecture test models (random weights) exported from PyTorch to ONNX bytes, each with
feeds at more than one size of its dynamic axes; built once per session."""
import functools

import numpy as np

from conftest import export


@functools.lru_cache(maxsize=None)
def bert_like(opset=17):
    """A 2-layer BERT encoder (transformers BertModel), outputs last_hidden_state and pooler_output;
    below opset 17 its LayerNorms are exported written out (ReduceMean, Sub, Pow, ...)."""
    import torch
    import transformers
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64)
    bert = transformers.BertModel(cfg).eval()

    class Enc(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = bert

        def forward(self, ids, mask):
            out = self.m(input_ids=ids, attention_mask=mask)
            return out.last_hidden_state, out.pooler_output
    ids = torch.randint(0, 100, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.int64)
    data = export(Enc(), (ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state", "pooler_output"],
                  {"input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"}}, opset=opset)
    rng = np.random.default_rng(0)
    feeds = []
    for b, s in ((2, 7), (1, 12)):
        m = np.ones((b, s), np.int64)
        m[0, s - 2:] = 0   # padding in the first row
        feeds.append({"input_ids": rng.integers(0, 100, (b, s)).astype(np.int64), "attention_mask": m})
    return data, feeds


@functools.lru_cache(maxsize=None)
def gpt2_like(opset=17):
    """GPT-2's pre-norm decoder blocks written in plain PyTorch: causal masked-fill attention,
    the tanh GELU written out, a tied output head."""
    import torch
    nn = torch.nn
    torch.manual_seed(0)
    d, heads, vocab = 32, 4, 120

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / (d // heads) ** 0.5
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~causal, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(y)
            return x + self.out(nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(64, d)
            self.blocks = nn.Sequential(Block(), Block())
            self.ln = nn.LayerNorm(d)

        def forward(self, ids):
            pos = torch.arange(ids.shape[1], device=ids.device)
            h = self.ln(self.blocks(self.wte(ids) + self.wpe(pos)))
            return h @ self.wte.weight.T    # tied output head
    ids = torch.randint(0, vocab, (1, 9))
    data = export(GPT(), (ids,), ["input_ids"], ["logits"], {"input_ids": {0: "b", 1: "s"}}, opset=opset)
    rng = np.random.default_rng(1)
    return data, [{"input_ids": rng.integers(0, vocab, (1, 9)).astype(np.int64)},
                  {"input_ids": rng.integers(0, vocab, (2, 5)).astype(np.int64)}]


def _block(cin, cout, stride):
    import torch
    nn = torch.nn

    class Basic(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
            self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = None if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))
    return Basic()


def randomize_bn(m):
    import torch
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.2, 0.2)
            mod.running_var.uniform_(0.5, 1.5)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.2, 0.2)
    return m


@functools.lru_cache(maxsize=None)
def resnet18():
    """ResNet-18 (2-2-2-2 basic blocks, full width, 1000 classes), dynamic batch and size (run small)."""
    import torch
    nn = torch.nn
    torch.manual_seed(0)
    w = 64

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            chans = [w, w, 2 * w, 4 * w, 8 * w]
            layers = []
            for i in range(4):
                layers += [_block(chans[i], chans[i + 1], 1 if i == 0 else 2), _block(chans[i + 1], chans[i + 1], 1)]
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(8 * w, 1000)

        def forward(self, x):
            y = self.layers(self.stem(x))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))
    model = randomize_bn(ResNet18())
    data = export(model, (torch.randn(1, 3, 64, 64),), ["x"], ["y"], {"x": {0: "b", 2: "h", 3: "w"}})
    rng = np.random.default_rng(3)
    return data, [{"x": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)},
                  {"x": rng.standard_normal((2, 3, 48, 40)).astype(np.float32)}]

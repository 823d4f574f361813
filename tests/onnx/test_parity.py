"""Real-architecture models (random weights) exported from PyTorch: express.onnx matches
onnxruntime to 1e-4 in fp32, at more than one size of their dynamic axes."""
import numpy as np
import pytest

import express.onnx as eo

from conftest import close, export, ort_run

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")


def _check(data, feeds_list, tol=1e-4):
    m = eo.load(data)
    for feeds in feeds_list:
        want = ort_run(data, feeds)
        got = m.run(feeds)
        for k in want:
            close(got[k], want[k], tol)
    return m


def test_bert_like_encoder():
    transformers = pytest.importorskip("transformers")
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
                  {"input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"}})
    rng = np.random.default_rng(0)
    feeds = []
    for b, s in ((2, 7), (1, 12)):
        m = np.ones((b, s), np.int64)
        m[0, s - 2:] = 0   # padding in the first row
        feeds.append({"input_ids": rng.integers(0, 100, (b, s)).astype(np.int64), "attention_mask": m})
    _check(data, feeds)


def test_gpt2_like_decoder():
    nn = torch.nn
    torch.manual_seed(0)
    d, heads, vocab = 32, 4, 120

    class Block(nn.Module):   # GPT-2's pre-norm block: causal attention, tanh-GELU MLP
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
    data = export(GPT(), (ids,), ["input_ids"], ["logits"], {"input_ids": {0: "b", 1: "s"}})
    rng = np.random.default_rng(1)
    _check(data, [{"input_ids": rng.integers(0, vocab, (1, 9)).astype(np.int64)},
                  {"input_ids": rng.integers(0, vocab, (2, 5)).astype(np.int64)}])


def test_lstm():
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True, bidirectional=True)
            self.gru = torch.nn.GRU(32, 8, batch_first=True)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, x):
            y, _ = self.lstm(x)
            y, _ = self.gru(y)
            return self.head(y)
    x = torch.randn(2, 5, 8)
    data = export(Net(), (x,), ["x"], ["y"], {"x": {0: "b", 1: "t"}})
    rng = np.random.default_rng(2)
    _check(data, [{"x": rng.standard_normal((2, 5, 8)).astype(np.float32)},
                  {"x": rng.standard_normal((3, 7, 8)).astype(np.float32)}])


def _block(cin, cout, stride):
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


def _randomize_bn(m):
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.2, 0.2)
            mod.running_var.uniform_(0.5, 1.5)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.2, 0.2)
    return m


def test_resnet18():
    nn = torch.nn
    torch.manual_seed(0)
    w = 16  # ResNet-18's layout (2-2-2-2 basic blocks) at a quarter of its width

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
            self.fc = nn.Linear(8 * w, 10)

        def forward(self, x):
            y = self.layers(self.stem(x))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))
    model = _randomize_bn(ResNet18())
    x = torch.randn(1, 3, 64, 64)
    data = export(model, (x,), ["x"], ["y"], {"x": {0: "b", 2: "h", 3: "w"}})
    rng = np.random.default_rng(3)
    _check(data, [{"x": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)},
                  {"x": rng.standard_normal((2, 3, 48, 40)).astype(np.float32)}])


def test_mobilenet_v2():
    nn = torch.nn
    torch.manual_seed(0)

    def inverted(cin, cout, stride, t):
        hid = cin * t

        class IR(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Sequential(
                    nn.Conv2d(cin, hid, 1, bias=False), nn.BatchNorm2d(hid), nn.ReLU6(),
                    nn.Conv2d(hid, hid, 3, stride, 1, groups=hid, bias=False), nn.BatchNorm2d(hid), nn.ReLU6(),
                    nn.Conv2d(hid, cout, 1, bias=False), nn.BatchNorm2d(cout))
                self.res = stride == 1 and cin == cout

            def forward(self, x):
                return x + self.body(x) if self.res else self.body(x)
        return IR()
    # MobileNetV2's inverted-residual stages (t, c, n, s) at reduced width
    cfg = [(1, 8, 1, 1), (6, 12, 2, 2), (6, 16, 3, 2), (6, 24, 2, 2), (6, 32, 1, 1)]
    layers = [nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6()]
    cin = 8
    for t, c, n, s in cfg:
        for i in range(n):
            layers.append(inverted(cin, c, s if i == 0 else 1, t))
            cin = c
    layers += [nn.Conv2d(cin, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU6(), nn.AdaptiveAvgPool2d(1),
               nn.Flatten(), nn.Dropout(0.2), nn.Linear(64, 10)]
    model = _randomize_bn(nn.Sequential(*layers))
    x = torch.randn(1, 3, 64, 64)
    data = export(model, (x,), ["x"], ["y"], {"x": {0: "b"}})
    rng = np.random.default_rng(4)
    _check(data, [{"x": rng.standard_normal((2, 3, 64, 64)).astype(np.float32)}])


def test_yolo_style_head():
    nn = torch.nn
    torch.manual_seed(0)

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 8, 3, 2, 1)
            self.b = nn.Conv2d(8, 8, 3, 2, 1)
            self.out = nn.Conv2d(16, 6, 1)

        def forward(self, x):
            p3 = nn.functional.silu(self.a(x))
            p4 = nn.functional.silu(self.b(p3))
            up = nn.functional.interpolate(p4, scale_factor=2.0, mode="nearest")
            y = torch.sigmoid(self.out(torch.cat([p3, up], 1)))
            return y.flatten(2).permute(0, 2, 1)
    data = export(Head(), (torch.randn(1, 3, 32, 32),), ["x"], ["y"], opset=13)
    rng = np.random.default_rng(5)
    _check(data, [{"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}])


def test_minilm_real_model(minilm_dir):
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModel.from_pretrained(minilm_dir).eval()
    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    enc = tok(["Express runs ONNX models.", "A second, somewhat longer sentence for padding."],
              padding=True, return_tensors="pt")

    class Enc(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, mask, types):
            return self.m(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    args = (enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    names = ["input_ids", "attention_mask", "token_type_ids"]
    data = export(Enc(model), args, names, ["last_hidden_state"], {n: {0: "b", 1: "s"} for n in names}, opset=14)
    feeds = {n: a.numpy() for n, a in zip(names, args)}
    m = _check(data, [feeds])
    with torch.no_grad():
        ref = model(**enc).last_hidden_state.numpy()
    close(m.run(feeds)["last_hidden_state"], ref, 1e-4)

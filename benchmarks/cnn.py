"""CNN inference side by side: Express vs onnxruntime vs MNN, batch 1, 224x224, random weights.

    python benchmarks/cnn.py [--models resnet18,resnet50,mobilenet_v2] [--threads 1,2] [--runs 15]

Each architecture is built twice from one definition (benchmarks/cnn_models.py): a PyTorch module,
exported to ONNX for onnxruntime (all graph optimizations) and converted with MNN's converter, and
an express.nn module loaded with the same weights (BatchNorm statistics randomized so it is not an
identity). Outputs are checked to agree before timing. Express runs through `ex.compile`. Each
engine gets warm-up runs, then the median (and best) of `--runs` timed runs per thread count;
engines alternate run by run so machine noise hits them alike, with a short idle gap (`--gap`) before
each timed run so one engine's still-spinning pool threads do not compete with the next engine.
Needs: torch, onnx, onnxruntime, mnn.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import express as ex  # noqa: E402
import express.nn as enn  # noqa: E402
from cnn_models import build  # noqa: E402


def torch_model(name, seed=0):
    import torch
    torch.manual_seed(seed)
    m = build(name, torch.nn).eval()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.normal_(0, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.normal_(0, 0.1)
    return m


def export_onnx(m, path):
    import torch
    x = torch.zeros(1, 3, 224, 224)
    torch.onnx.export(m, (x,), path, input_names=["x"], output_names=["y"], opset_version=17, dynamo=False)


def convert_mnn(onnx_path, mnn_path):
    # the converter itself (MNN's Python wrapper around it also phones home; skip that)
    code = "import sys, _tools; _tools.mnnconvert(['mnnconvert'] + sys.argv[1:])"
    subprocess.run([sys.executable, "-c", code, "-f", "ONNX", "--modelFile", onnx_path, "--MNNModel", mnn_path,
                    "--bizCode", "bench"], check=True, capture_output=True)


class Ort:
    name = "onnxruntime"

    def __init__(self, path, threads):
        import onnxruntime as ort
        o = ort.SessionOptions()
        o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        o.intra_op_num_threads = threads
        o.inter_op_num_threads = 1
        o.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.s = ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])

    def __call__(self, x):
        return self.s.run(None, {"x": x})[0]


class Mnn:
    name = "MNN"

    def __init__(self, path, threads):
        import MNN
        self.MNN = MNN
        self.net = MNN.Interpreter(path)
        self.net.setSessionMode(9)  # Session_Release: keep no converter-side state
        self.sess = self.net.createSession({"numThread": threads, "backend": "CPU"})
        self.inp = self.net.getSessionInput(self.sess)
        self.out = self.net.getSessionOutput(self.sess)
        self.host = MNN.Tensor((1, 3, 224, 224), MNN.Halide_Type_Float, np.zeros((1, 3, 224, 224), np.float32),
                               MNN.Tensor_DimensionType_Caffe)

    def __call__(self, x):
        MNN = self.MNN
        host = MNN.Tensor((1, 3, 224, 224), MNN.Halide_Type_Float, x, MNN.Tensor_DimensionType_Caffe)
        self.inp.copyFrom(host)
        self.net.runSession(self.sess)
        shape = self.out.getShape()
        res = MNN.Tensor(shape, MNN.Halide_Type_Float, np.zeros(shape, np.float32), MNN.Tensor_DimensionType_Caffe)
        self.out.copyToHostTensor(res)
        return np.array(res.getData(), np.float32).reshape(shape)


class Express:
    name = "Express"

    def __init__(self, model, threads):
        self.threads = threads
        self.f = ex.compile(lambda t: model(t))

    def __call__(self, x):
        ex.set_num_threads(self.threads)
        return self.f(x).numpy()


def bench(engines, x, runs, warmup=3, gap=0.0):
    for e in engines:
        for _ in range(warmup):
            e(x)
    times = {e.name: [] for e in engines}
    for _ in range(runs):
        for e in engines:
            if gap:  # let the previous engine's spinning worker threads go idle first
                time.sleep(gap)
            t0 = time.perf_counter()
            e(x)
            times[e.name].append(time.perf_counter() - t0)
    return {k: (float(np.median(v)) * 1e3, float(np.min(v)) * 1e3) for k, v in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,resnet50,mobilenet_v2")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--gap", type=float, default=0.05,
                    help="seconds of idle before each timed run, so the worker threads one engine leaves "
                         "spinning do not take cores from the next (0: back to back)")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    import onnxruntime
    rows = []
    tmp = tempfile.mkdtemp(prefix="express-cnn-")
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    for name in args.models.split(","):
        tm = torch_model(name)
        onnx_path, mnn_path = os.path.join(tmp, name + ".onnx"), os.path.join(tmp, name + ".mnn")
        export_onnx(tm, onnx_path)
        convert_mnn(onnx_path, mnn_path)
        em = build(name, enn)
        em.load_weights({k: v.numpy() for k, v in tm.state_dict().items()})
        with torch.no_grad():
            want = tm(torch.from_numpy(x)).numpy()
        for nt in [int(t) for t in args.threads.split(",")]:
            engines = [Express(em, nt), Ort(onnx_path, nt), Mnn(mnn_path, nt)]
            for e in engines:
                err = np.abs(e(x) - want).max() / np.abs(want).max()
                if err > 1e-3:
                    raise SystemExit(f"{name}: {e.name} output differs from PyTorch (max error {err:.2e} of max)")
            t = bench(engines, x, args.runs, gap=args.gap)
            rows.append((name, nt, t))
            print(f"{name} threads={nt}: " + ", ".join(f"{k} {v[0]:.1f} ms" for k, v in t.items()), file=sys.stderr,
                  flush=True)
    print(f"\nCPU: {_cpu()}; Express ISA {ex.isa()}; onnxruntime {onnxruntime.__version__}; MNN "
          f"{__import__('MNN').version()}; batch 1, 3x224x224, float32, median of {args.runs} runs\n")
    print("Cells: median ms (best run in parentheses); ratios > 1 mean Express is faster.\n")
    print("| model | threads | Express ms | onnxruntime ms | MNN ms | ORT / Express | MNN / Express |")
    print("|---|---|---|---|---|---|---|")
    for name, nt, t in rows:
        e, o, m = t["Express"], t["onnxruntime"], t["MNN"]
        f = lambda v: f"{v[0]:.1f} ({v[1]:.1f})"  # noqa: E731
        r = lambda a: f"{a[0] / e[0]:.2f}x ({a[1] / e[1]:.2f}x)"  # noqa: E731
        print(f"| {name} | {nt} | {f(e)} | {f(o)} | {f(m)} | {r(o)} | {r(m)} |")


def _cpu():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} logical CPUs)"
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()

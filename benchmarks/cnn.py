"""CNN inference side by side: Express vs onnxruntime vs MNN, batch 1, 224x224, random weights.

    python benchmarks/cnn.py [--models resnet18,resnet50,mobilenet_v2] [--threads 1,2] [--runs 15] [--rounds 3]

Each architecture is built twice from one definition (benchmarks/cnn_models.py): a PyTorch module,
exported to ONNX for onnxruntime (all graph optimizations) and converted with MNN's converter, and
an express.nn module loaded with the same weights (BatchNorm statistics randomized so it is not an
identity). Express runs through `ex.compile`.

Each engine runs in a process of its own (`--worker`), which checks its output against PyTorch's,
makes warm-up runs and then `--runs` timed runs, each after an idle gap (`--gap`); the engines take
turns, `--rounds` times, in rotating order, so machine noise hits them alike.  The table gives the
median (and best) of all of an engine's timed runs.  Two engines' thread pools in one process
disturb each other at two threads: in one process with Express, onnxruntime's MobileNetV2 took a
median 11 ms against 4.4 alone, and with Express's workers unpinned it was Express that slowed.
Needs: torch, onnx, onnxruntime, mnn.
"""
from __future__ import annotations

import argparse
import json
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


ENGINES = {"Express": "express", "onnxruntime": "ort", "MNN": "mnn"}


def work(engine, name, folder, threads, runs, gap, warmup=3):
    """One engine in this process: check its output, then the times (seconds) of `runs` runs."""
    f = lambda ext: os.path.join(folder, name + ext)  # noqa: E731
    x, want = np.load(f(".x.npy")), np.load(f(".want.npy"))
    if engine == "express":
        m = build(name, enn)
        with np.load(f(".weights.npz")) as w:
            m.load_weights(dict(w))
        e = Express(m, threads)
    else:
        e = Ort(f(".onnx"), threads) if engine == "ort" else Mnn(f(".mnn"), threads)
    err = np.abs(e(x) - want).max() / np.abs(want).max()
    if err > 1e-3:
        raise SystemExit(f"{name}: {e.name} output differs from PyTorch (max error {err:.2e} of max)")
    for _ in range(warmup):
        e(x)
    times = []
    for _ in range(runs):
        if gap:
            time.sleep(gap)
        t0 = time.perf_counter()
        e(x)
        times.append(time.perf_counter() - t0)
    return times


def bench(name, folder, threads, runs, rounds, gap):
    """{engine name: (median ms, best ms)} over every round's runs, each engine in its own process."""
    times = {k: [] for k in ENGINES}
    order = list(ENGINES)
    for r in range(rounds):
        for k in order[r % len(order):] + order[:r % len(order)]:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", ENGINES[k], "--models", name, "--folder",
                   folder, "--threads", str(threads), "--runs", str(runs), "--gap", str(gap)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(f"{name}, {k} at {threads} thread(s) failed:\n{out.stderr[-2000:]}")
            times[k] += json.loads(out.stdout.strip().splitlines()[-1])
    return {k: (float(np.median(v)) * 1e3, float(np.min(v)) * 1e3) for k, v in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,resnet50,mobilenet_v2")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=15, help="timed runs per engine process")
    ap.add_argument("--rounds", type=int, default=3, help="processes per engine, taking turns with the others")
    ap.add_argument("--gap", type=float, default=0.05, help="seconds of idle before each timed run (0: back to back)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(work(args.worker, args.models, args.folder, int(args.threads), args.runs, args.gap)))
        return
    import onnxruntime
    import torch
    torch.set_num_threads(1)
    rows = []
    tmp_dir = tempfile.TemporaryDirectory(prefix="express-cnn-")  # removed at exit
    tmp = tmp_dir.name
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    for name in args.models.split(","):
        tm = torch_model(name)
        f = lambda ext: os.path.join(tmp, name + ext)  # noqa: E731
        export_onnx(tm, f(".onnx"))
        convert_mnn(f(".onnx"), f(".mnn"))
        np.savez(f(".weights.npz"), **{k: v.numpy() for k, v in tm.state_dict().items()})
        np.save(f(".x.npy"), x)
        with torch.no_grad():
            np.save(f(".want.npy"), tm(torch.from_numpy(x)).numpy())
        for nt in [int(t) for t in args.threads.split(",")]:
            t = bench(name, tmp, nt, args.runs, args.rounds, args.gap)
            rows.append((name, nt, t))
            print(f"{name} threads={nt}: " + ", ".join(f"{k} {v[0]:.1f} ms" for k, v in t.items()), file=sys.stderr,
                  flush=True)
    print(f"\nCPU: {_cpu()}; Express ISA {ex.isa()}; onnxruntime {onnxruntime.__version__}; MNN "
          f"{__import__('MNN').version()}; batch 1, 3x224x224, float32, "
          f"{args.rounds} processes x {args.runs} runs per engine, {args.gap * 1e3:.0f} ms idle before each\n")
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

"""Command-line tools for models: `python -m express convert|run|bench`.

    python -m express convert model.onnx model.exm [--quant-bits 8]
    python -m express run model.exm --input x=x.npy [--output-dir out/]
    python -m express bench model.exm [--shape x=1,3,224,224] [--iters 20]
"""
from __future__ import annotations

import os
import time

import numpy as np


def _load(path):
    import express as ex
    if os.fspath(path).endswith(".exm"):
        return ex.load(path)
    import express.onnx
    return express.onnx.load(path)


def convert(args) -> int:
    import express.onnx
    m = express.onnx.load(args.src)
    rep = m.save(args.dst, quant_bits=args.quant_bits, group_size=args.group_size)
    src = os.path.getsize(args.src)
    print(f"{args.src} ({src / 1e6:.2f} MB) -> {rep['path']} ({rep['bytes'] / 1e6:.2f} MB, "
          f"{100 * rep['bytes'] / max(src, 1):.0f}%)")
    if args.quant_bits:
        print(f"  {rep['quantized']} weight tensors as int{args.quant_bits} ({rep['packed']} kept packed when loaded, "
              f"{rep['quantized'] - rep['packed']} expanded); max relative weight error {rep['max_rel_error']:.3g}")
    return 0


def _parse_inputs(pairs):
    feeds = {}
    for p in pairs or []:
        name, _, file = p.partition("=")
        if not file:
            raise SystemExit(f"--input expects name=file.npy, got {p!r}")
        feeds[name] = np.load(file, allow_pickle=False)
    return feeds


def run(args) -> int:
    m = _load(args.model)
    out = m.run(_parse_inputs(args.input))
    for k, v in out.items():
        v = np.asarray(v)
        print(f"{k}: shape {v.shape} {v.dtype}  min {v.min() if v.size else '-'} max {v.max() if v.size else '-'}")
        if args.output_dir:
            os.makedirs(args.output_dir, exist_ok=True)
            np.save(os.path.join(args.output_dir, f"{k}.npy"), v)
    return 0


def _random_feeds(m, shapes):
    rng = np.random.default_rng(0)
    feeds = {}
    for v in m.inputs:
        if v.name in shapes:
            shape = shapes[v.name]
        elif v.shape is None:
            raise SystemExit(f"input {v.name!r} has no declared shape: pass --shape {v.name}=...")
        else:
            shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in v.shape)
        d = v.dtype.np if v.dtype is not None else np.float32
        feeds[v.name] = (rng.standard_normal(shape).astype(d) if np.dtype(d).kind == "f"
                         else rng.integers(0, 2, shape).astype(d))
    return feeds


def bench(args) -> int:
    m = _load(args.model)
    shapes = {}
    for p in args.shape or []:
        name, _, dims = p.partition("=")
        shapes[name] = tuple(int(x) for x in dims.split(","))
    feeds = _random_feeds(m, shapes)
    for _ in range(args.warmup):
        m.run(feeds)
    times = []
    for _ in range(args.iters):
        t = time.perf_counter()
        m.run(feeds)
        times.append(time.perf_counter() - t)
    t = np.array(times) * 1e3
    print(f"{args.model}: {', '.join(f'{k}{list(v.shape)}' for k, v in feeds.items())}")
    print(f"  median {np.median(t):.2f} ms  min {t.min():.2f} ms  mean {t.mean():.2f} ms  ({args.iters} runs)")
    return 0


def add_subcommands(sub) -> dict:
    """Add convert/run/bench to an argparse subparsers object; returns {name: handler}."""
    c = sub.add_parser("convert", help="convert an ONNX model to .exm")
    c.add_argument("src")
    c.add_argument("dst")
    c.add_argument("--quant-bits", type=int, choices=(4, 8), default=None)
    c.add_argument("--group-size", type=int, choices=(32, 64), default=64)
    r = sub.add_parser("run", help="run a model (.exm or .onnx) on .npy inputs")
    r.add_argument("model")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    r.add_argument("--output-dir")
    b = sub.add_parser("bench", help="time a model on random inputs")
    b.add_argument("model")
    b.add_argument("--shape", action="append", metavar="NAME=D0,D1,...")
    b.add_argument("--iters", type=int, default=20)
    b.add_argument("--warmup", type=int, default=2)
    return {"convert": convert, "run": run, "bench": bench}


def main_with(args, handlers) -> int:
    from .errors import ExpressError
    try:
        return handlers[args.cmd](args)
    except ExpressError as e:
        print(f"error: {e}")
        return 1

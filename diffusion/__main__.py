"""Command line: `python -m diffusion generate MODEL "prompt" -o out.png [options]`.

MODEL is a diffusers Stable Diffusion folder (model_index.json, text_encoder/, tokenizer/, unet/,
vae/, scheduler/)."""
from __future__ import annotations

import argparse
import sys
import time

from express import ExpressError


def _parser():
    p = argparse.ArgumentParser(prog="python -m diffusion", description="Stable Diffusion on Express")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="text-to-image, or image-to-image with --init-image")
    g.add_argument("model", help="a diffusers Stable Diffusion folder")
    g.add_argument("prompt")
    g.add_argument("-o", "--output", default="out.png", help="output image (PNG/JPEG); with several "
                   "images, -0, -1, ... are appended to the name")
    g.add_argument("--negative", default=None, help="negative prompt")
    g.add_argument("--steps", type=int, default=20)
    g.add_argument("--guidance", type=float, default=7.5, help="classifier-free guidance scale")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--scheduler", default=None, help="ddim, pndm, euler, euler_a, dpm++2m, dpm++2m_karras, "
                   "lcm (default: the model's)")
    g.add_argument("--height", type=int, default=None)
    g.add_argument("--width", type=int, default=None)
    g.add_argument("--num-images", type=int, default=1)
    g.add_argument("--init-image", default=None, help="image-to-image from this picture")
    g.add_argument("--strength", type=float, default=0.8, help="image-to-image: how much to change (0..1]")
    g.add_argument("--dtype", default="float16", choices=["float16", "float32", "bfloat16"],
                   help="weight precision (compute is float32)")
    g.add_argument("--clip-skip", type=int, default=None)
    g.add_argument("--threads", type=int, default=None)
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def generate(a) -> int:
    import express as ex
    from .pipeline import StableDiffusionPipeline
    if a.threads:
        ex.set_num_threads(a.threads)
    t0 = time.perf_counter()
    pipe = StableDiffusionPipeline.from_pretrained(a.model, dtype=a.dtype)
    kw = dict(negative_prompt=a.negative, height=a.height, width=a.width, num_inference_steps=a.steps,
              guidance_scale=a.guidance, seed=a.seed, scheduler=a.scheduler, clip_skip=a.clip_skip,
              num_images_per_prompt=a.num_images, progress=not a.quiet)
    t1 = time.perf_counter()
    if a.init_image:
        from PIL import Image
        try:
            init = Image.open(a.init_image)
        except OSError as e:
            raise ExpressError(f"cannot read init image {a.init_image!r}: {e}") from None
        out = pipe.img2img(a.prompt, init, strength=a.strength, **kw)
    else:
        out = pipe(a.prompt, **kw)
    t2 = time.perf_counter()
    names = [a.output] if len(out.images) == 1 else \
        [a.output.rsplit(".", 1)[0] + f"-{i}." + a.output.rsplit(".", 1)[-1] for i in range(len(out.images))]
    for im, name in zip(out.images, names):
        im.save(name)
    if not a.quiet:
        print(f"saved {', '.join(names)} (load {t1 - t0:.1f} s, generate {t2 - t1:.1f} s)", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    try:
        return generate(a)
    except ExpressError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The whole pipeline against diffusers' StableDiffusionPipeline / Img2ImgPipeline on the tiny
random model: the same latents (or noise) in, [0, 1] pixels out within 1e-3."""
import numpy as np
import pytest

import express as ex
from diffusion import StableDiffusionPipeline
from express import ModelError

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

PIXEL_TOL = 1e-3
SCHEDULERS = ["PNDMScheduler", "DDIMScheduler", "EulerDiscreteScheduler", "DPMSolverMultistepScheduler",
              "LCMScheduler"]


@pytest.fixture(scope="module")
def pipes(sd_folder):
    root, ref = sd_folder
    return StableDiffusionPipeline.from_pretrained(root), ref


def _ref_with(ref, name):
    ref.scheduler = getattr(diffusers, name).from_config(ref.scheduler.config)
    return ref


def _latents(seed=0, shape=(1, 4, 16, 16)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_txt2img_matches_diffusers(pipes, name):
    ours, ref = pipes
    steps = 1 if name == "LCMScheduler" else 4  # LCM adds noise between steps; its last step does not
    lat = _latents()
    kw = dict(prompt="a photo of an astronaut", negative_prompt="blurry", num_inference_steps=steps,
              guidance_scale=6.0, output_type="np")
    with torch.no_grad():
        want = _ref_with(ref, name)(**kw, latents=torch.from_numpy(lat)).images
    got = ours(**kw, latents=lat, scheduler=name, progress=False).images
    assert got.shape == want.shape == (1, 32, 32, 3)
    np.testing.assert_allclose(got, want, atol=PIXEL_TOL)


def test_no_guidance_batch(pipes):
    ours, ref = pipes
    lat = _latents(1, (2, 4, 16, 16))
    kw = dict(prompt=["a cat", "the red fox"], num_inference_steps=3, guidance_scale=1.0, output_type="np")
    with torch.no_grad():
        want = _ref_with(ref, "EulerDiscreteScheduler")(**kw, latents=torch.from_numpy(lat)).images
    got = ours(**kw, latents=lat, scheduler="euler", progress=False).images
    np.testing.assert_allclose(got, want, atol=PIXEL_TOL)


@pytest.mark.parametrize("name", ["DDIMScheduler", "EulerDiscreteScheduler", "DPMSolverMultistepScheduler"])
def test_img2img_matches_diffusers(pipes, name, monkeypatch):
    ours, ref = pipes
    from diffusers.pipelines.stable_diffusion import pipeline_stable_diffusion_img2img as mod
    # our image-to-image encodes with the posterior mean; make diffusers do the same
    monkeypatch.setattr(mod, "retrieve_latents", lambda enc, generator=None, sample_mode="sample": enc.latent_dist.mode())
    img = np.random.default_rng(3).random((1, 32, 32, 3)).astype(np.float32)
    r2 = diffusers.StableDiffusionImg2ImgPipeline(**{k: v for k, v in ref.components.items()})
    r2.scheduler = getattr(diffusers, name).from_config(ref.scheduler.config)
    r2.set_progress_bar_config(disable=True)
    kw = dict(prompt="a painting of a horse", num_inference_steps=5, strength=0.6, guidance_scale=5.0,
              output_type="np")
    noise = torch.randn((1, 4, 16, 16), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = r2(**kw, image=img, generator=torch.Generator().manual_seed(7)).images
    got = ours.img2img(image=img, noise=noise.numpy(), scheduler=name, progress=False, **kw).images
    np.testing.assert_allclose(got, want, atol=PIXEL_TOL)


def test_tiled_decode_matches_diffusers(pipes):
    ours, ref = pipes
    z = _latents(4, (1, 4, 28, 36)) * 0.18215  # larger than one 16-latent tile
    ref.vae.enable_tiling()
    with torch.no_grad():
        want = ref.vae.decode(torch.from_numpy(z / 0.18215)).sample.numpy()
    ref.vae.disable_tiling()
    want = np.clip(want / 2 + 0.5, 0, 1).transpose(0, 2, 3, 1)
    got = ours.decode_latents(z)
    assert got.shape == (1, 56, 72, 3)
    np.testing.assert_allclose(got, want, atol=PIXEL_TOL)


def test_seed_reproducible_across_threads(pipes):
    ours, _ = pipes
    before = ex.get_num_threads()
    outs = []
    for n in (1, 2):
        ex.set_num_threads(n)
        outs.append(ours("a cat", num_inference_steps=2, seed=42, output_type="np", progress=False).images)
    ex.set_num_threads(before)
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-5)
    other = ours("a cat", num_inference_steps=2, seed=43, output_type="np", progress=False).images
    assert np.abs(other - outs[0]).max() > 1e-3


def test_pil_output_callback_and_stop(pipes):
    ours, _ = pipes
    seen = []
    out = ours("a cat", num_inference_steps=3, seed=0, callback=lambda i, t, lat: seen.append((i, lat.shape)),
               scheduler="ddim", progress=False)
    assert out.images[0].size == (32, 32) and out.images[0].mode == "RGB"
    assert [i for i, _ in seen] == [0, 1, 2] and seen[0][1] == (1, 4, 16, 16)
    stopped = []
    ours("a cat", num_inference_steps=5, seed=0, output_type="latent", progress=False,
         callback=lambda i, t, lat: stopped.append(i) or i < 1)
    assert stopped == [0, 1]


def test_fp16_variant(sd_folder, tmp_path):
    """float16 weights ("fp16" variant files) with float32 compute: the image diffusers makes from
    the same rounded weights in float32."""
    root, ref = sd_folder
    import shutil
    half_root = tmp_path / "half"
    shutil.copytree(root, half_root)
    import copy
    rounded = copy.deepcopy(ref).to(torch.float16)
    rounded.save_pretrained(half_root, variant="fp16", safe_serialization=True)
    rounded.to(torch.float32)
    assert (half_root / "unet" / "diffusion_pytorch_model.fp16.safetensors").is_file()
    half = StableDiffusionPipeline.from_pretrained(half_root, dtype="float16")
    assert all(p.dtype is ex.float16 for p in half.unet.named_parameters().values())
    lat = _latents(5)
    kw = dict(prompt="a cat", num_inference_steps=3, output_type="np")
    with torch.no_grad():
        want = rounded(**kw, latents=torch.from_numpy(lat)).images
    np.testing.assert_allclose(half(**kw, latents=lat, progress=False).images, want, atol=PIXEL_TOL)


def test_bad_input(pipes, sd_folder, tmp_path):
    ours, _ = pipes
    root, _ = sd_folder
    with pytest.raises(ModelError, match="multiples of 8"):
        ours("a cat", height=36, width=32, progress=False)
    with pytest.raises(ModelError, match="unknown scheduler 'nope'"):
        ours("a cat", scheduler="nope", progress=False)
    with pytest.raises(ModelError, match="latents must have shape"):
        ours("a cat", latents=np.zeros((1, 4, 8, 8), np.float32), progress=False)
    with pytest.raises(ModelError, match="strength"):
        ours.img2img("a cat", image=np.zeros((32, 32, 3), np.float32), strength=1.5, progress=False)
    with pytest.raises(ModelError, match="output_type"):
        ours("a cat", output_type="jpeg", progress=False)
    import shutil
    broken = tmp_path / "broken"
    shutil.copytree(root, broken)
    shutil.rmtree(broken / "vae")
    with pytest.raises(ModelError, match="no vae/ folder"):
        StableDiffusionPipeline.from_pretrained(broken)
    with pytest.raises(ModelError, match="model_index.json"):
        StableDiffusionPipeline.from_pretrained(tmp_path)
    (broken / "vae").mkdir()
    (broken / "vae" / "config.json").write_text((root / "vae" / "config.json").read_text())
    with pytest.raises(ModelError, match="no safetensors weights"):
        StableDiffusionPipeline.from_pretrained(broken)

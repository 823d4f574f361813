"""UNet and VAE against diffusers on the tiny random pipeline (fp32, and fp16 weights)."""
import numpy as np
import pytest

import express as ex
from diffusion.models import AutoencoderKL, UNet2DConditionModel
from diffusion.weights import load_component, read_json

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")


def _load(cls, root, name, **kw):
    return load_component(cls(read_json(root / name / "config.json")), root / name, **kw)


@pytest.mark.parametrize("t", [999, 421.5])
def test_unet_step(sd_folder, t):
    root, pipe = sd_folder
    unet = _load(UNet2DConditionModel, root, "unet")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 16, 16)).astype(np.float32)
    ctx = rng.standard_normal((2, 77, 32)).astype(np.float32)
    with torch.no_grad():
        want = pipe.unet(torch.from_numpy(x), torch.tensor(t), torch.from_numpy(ctx)).sample.numpy()
    got = unet(x, t, ctx).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=2e-4 * np.abs(want).max())


def test_vae_decode_encode(sd_folder):
    root, pipe = sd_folder
    vae = _load(AutoencoderKL, root, "vae")
    rng = np.random.default_rng(1)
    z = rng.standard_normal((1, 4, 16, 16)).astype(np.float32)
    img = np.clip(rng.standard_normal((1, 3, 32, 32)), -1, 1).astype(np.float32)
    with torch.no_grad():
        want = pipe.vae.decode(torch.from_numpy(z)).sample.numpy()
        dist = pipe.vae.encode(torch.from_numpy(img)).latent_dist
    np.testing.assert_allclose(vae.decode(z).numpy(), want, rtol=1e-3, atol=1e-4 * np.abs(want).max())
    mean, logvar = vae.encode(img)
    np.testing.assert_allclose(mean.numpy(), dist.mean.numpy(), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(logvar.numpy(), dist.logvar.numpy(), rtol=1e-3, atol=1e-4)
    assert vae.scale_factor == 2 and vae.config.scaling_factor == pipe.vae.config.scaling_factor


def test_unet_sd2_style_linear_projection(tmp_path):
    """SD 2.x: heads per block from attention_head_dim lists, linear projections, two
    transformer layers in a block."""
    cfg = dict(block_out_channels=(32, 64), layers_per_block=1, sample_size=8, cross_attention_dim=24,
               down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
               up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), attention_head_dim=(2, 4),
               use_linear_projection=True, transformer_layers_per_block=(2, 1), norm_num_groups=8,
               time_cond_proj_dim=16)
    torch.manual_seed(0)
    ref = diffusers.UNet2DConditionModel(**cfg).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ours = UNet2DConditionModel(dict(ref.config))
    ours.load_weights({k: v.numpy() for k, v in ref.state_dict().items()})
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    ctx = rng.standard_normal((1, 5, 24)).astype(np.float32)
    cond = rng.standard_normal((1, 16)).astype(np.float32)
    with torch.no_grad():
        want = ref(torch.from_numpy(x), 500, torch.from_numpy(ctx), timestep_cond=torch.from_numpy(cond)).sample.numpy()
    got = ours(x, 500, ctx, timestep_cond=cond).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=2e-4 * np.abs(want).max())


def test_fp16_weights_fp32_compute(sd_folder):
    root, pipe = sd_folder
    unet = _load(UNet2DConditionModel, root, "unet", dtype=ex.float16)
    assert all(p.dtype is ex.float16 for p in unet.named_parameters().values())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 16, 16)).astype(np.float32)
    ctx = rng.standard_normal((1, 77, 32)).astype(np.float32)
    import copy
    half = copy.deepcopy(pipe.unet).to(torch.float16).to(torch.float32)  # the same rounded weights, fp32 math
    with torch.no_grad():
        want = half(torch.from_numpy(x), 10, torch.from_numpy(ctx)).sample.numpy()
    got = unet(x, 10, ctx).numpy()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-3 * np.abs(want).max())


def test_sharded_weights(sd_folder, tmp_path):
    """A UNet saved in shards (an index json) loads the same."""
    root, pipe = sd_folder
    pipe.unet.save_pretrained(tmp_path, max_shard_size="100KB", safe_serialization=True)
    assert (tmp_path / "diffusion_pytorch_model.safetensors.index.json").is_file()
    a = _load(UNet2DConditionModel, root, "unet")
    b = load_component(UNet2DConditionModel(read_json(tmp_path / "config.json")), tmp_path)
    for k, v in a.named_parameters().items():
        np.testing.assert_array_equal(b.named_parameters()[k].numpy(), v.numpy())

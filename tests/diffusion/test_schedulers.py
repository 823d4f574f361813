"""Schedulers against diffusers: timesteps, sigmas and every step's output, on a fixed stream of
model outputs (the noise of stochastic steps passed explicitly to both)."""
import numpy as np
import pytest

from express import ModelError
from diffusion import schedulers as S

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

SD15 = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
            steps_offset=1, skip_prk_steps=True, set_alpha_to_one=False, clip_sample=False,
            timestep_spacing="leading")
SD21V = dict(SD15, prediction_type="v_prediction", timestep_spacing="trailing")

CASES = [
    ("DDIMScheduler", SD15, {}),
    ("DDIMScheduler", SD21V, {}),
    ("DDIMScheduler", dict(SD15, timestep_spacing="linspace", clip_sample=True), {"eta": 0.7}),
    ("PNDMScheduler", SD15, {}),
    ("PNDMScheduler", dict(SD15, skip_prk_steps=False), {}),
    ("PNDMScheduler", dict(SD21V, timestep_spacing="linspace"), {}),
    ("EulerDiscreteScheduler", SD15, {}),
    ("EulerDiscreteScheduler", dict(SD15, timestep_spacing="linspace", use_karras_sigmas=True), {}),
    ("EulerDiscreteScheduler", SD21V, {}),
    ("EulerAncestralDiscreteScheduler", SD15, {"noise": True}),
    ("EulerAncestralDiscreteScheduler", dict(SD21V, timestep_spacing="linspace"), {"noise": True}),
    ("DPMSolverMultistepScheduler", SD15, {}),
    ("DPMSolverMultistepScheduler", dict(SD15, use_karras_sigmas=True, timestep_spacing="linspace"), {}),
    ("DPMSolverMultistepScheduler", dict(SD21V, solver_type="heun"), {}),
    ("DPMSolverMultistepScheduler", dict(SD15, algorithm_type="sde-dpmsolver++"), {"noise": True}),
    ("LCMScheduler", dict(SD15, timestep_spacing="leading"), {"noise": True}),
]


def _theirs(name, config):
    return getattr(diffusers, name).from_config(config)


def _run(name, config, kw, steps, shape=(2, 4, 8, 8)):
    ours, ref = S.get_scheduler(name, config), _theirs(name, config)
    ours.set_timesteps(steps)
    ref.set_timesteps(steps)
    np.testing.assert_allclose(ours.timesteps, ref.timesteps.numpy(), rtol=1e-6, atol=1e-4)
    if hasattr(ref, "sigmas"):
        np.testing.assert_allclose(ours.sigmas, ref.sigmas.numpy(), rtol=2e-5, atol=1e-6)
    assert float(ours.init_noise_sigma) == pytest.approx(float(ref.init_noise_sigma), rel=1e-5)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32) * float(ref.init_noise_sigma)
    xt = torch.from_numpy(x.copy())
    w = rng.standard_normal(shape).astype(np.float32)
    for k, t in enumerate(ref.timesteps):
        inp_ref = ref.scale_model_input(xt, t)
        inp = ours.scale_model_input(x, ours.timesteps[k])
        np.testing.assert_allclose(inp, inp_ref.numpy(), rtol=1e-4, atol=1e-5)
        eps = (0.3 * inp + 0.5 * w * np.cos(k)).astype(np.float32)  # a stand-in model
        extra, ours_kw = {}, {}
        if kw.get("noise"):
            extra["generator"] = torch.Generator().manual_seed(k)
            ours_kw["noise"] = torch.randn(shape, generator=torch.Generator().manual_seed(k)).numpy()
        if "eta" in kw:
            extra["eta"] = ours_kw["eta"] = kw["eta"]
            extra["variance_noise"] = torch.from_numpy(w[::-1].copy())
            ours_kw["noise"] = w[::-1].copy()
        out_ref = ref.step(torch.from_numpy(eps), t, xt, **extra).prev_sample
        x = ours.step(eps, ours.timesteps[k], x, **ours_kw).prev_sample
        xt = out_ref
        scale = max(1.0, float(np.abs(out_ref.numpy()).max()))
        np.testing.assert_allclose(x, out_ref.numpy(), rtol=1e-4, atol=2e-5 * scale, err_msg=f"step {k} (t={t})")


@pytest.mark.parametrize("name,config,kw", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize("steps", [4, 25])
def test_matches_diffusers(name, config, kw, steps):
    _run(name, config, kw, steps)


@pytest.mark.parametrize("name", ["DDIMScheduler", "EulerDiscreteScheduler", "DPMSolverMultistepScheduler",
                                  "PNDMScheduler", "EulerAncestralDiscreteScheduler"])
def test_add_noise_and_begin_index(name):
    """Image-to-image: noise the init latents at the first kept timestep, start counting there."""
    config = SD15
    ours, ref = S.get_scheduler(name, config), _theirs(name, config)
    ours.set_timesteps(10)
    ref.set_timesteps(10)
    start = 4 * ref.order
    ours.set_begin_index(start)
    if hasattr(ref, "set_begin_index"):
        ref.set_begin_index(start)
    rng = np.random.default_rng(1)
    x0, z = rng.standard_normal((2, 1, 4, 4, 4)).astype(np.float32)
    t = ref.timesteps[start:start + 1]
    want = ref.add_noise(torch.from_numpy(x0), torch.from_numpy(z), t).numpy()
    got = ours.add_noise(x0, z, ours.timesteps[start:start + 1])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_short_names_and_config():
    s = S.get_scheduler("dpm++2m_karras", dict(SD15, _class_name="PNDMScheduler"))
    assert isinstance(s, S.DPMSolverMultistepScheduler) and s.config["use_karras_sigmas"]
    assert s.config["steps_offset"] == 1 and s.config["beta_schedule"] == "scaled_linear"
    assert isinstance(S.get_scheduler(None, dict(SD15, _class_name="EulerDiscreteScheduler")),
                      S.EulerDiscreteScheduler)
    with pytest.raises(ModelError, match="unknown scheduler 'heun'"):
        S.get_scheduler("heun", SD15)
    with pytest.raises(ModelError, match="beta_schedule"):
        S.get_scheduler("ddim", dict(SD15, beta_schedule="sigmoid"))
    with pytest.raises(ModelError, match="set_timesteps"):
        S.get_scheduler("ddim", SD15).step(np.zeros(1), 1, np.zeros(1))

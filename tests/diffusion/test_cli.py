"""`python -m diffusion generate` end to end on the tiny model."""
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from diffusion.__main__ import main


def test_generate_and_img2img(sd_folder, tmp_path):
    root, _ = sd_folder
    out = tmp_path / "out.png"
    assert main(["generate", str(root), "a photo of a cat", "-o", str(out), "--steps", "2", "--seed", "0",
                 "--scheduler", "euler", "--negative", "blurry", "--quiet"]) == 0
    img = Image.open(out)
    assert img.size == (32, 32)
    again = tmp_path / "again.png"
    main(["generate", str(root), "a photo of a cat", "-o", str(again), "--steps", "2", "--seed", "0",
          "--scheduler", "euler", "--negative", "blurry", "--quiet"])
    np.testing.assert_array_equal(np.asarray(Image.open(again)), np.asarray(img))
    edited = tmp_path / "edit.png"
    assert main(["generate", str(root), "a painting", "-o", str(edited), "--steps", "4", "--init-image", str(out),
                 "--strength", "0.5", "--quiet", "--dtype", "float32"]) == 0
    assert Image.open(edited).size == (32, 32)


def test_errors_are_messages(sd_folder, tmp_path, capsys):
    root, _ = sd_folder
    assert main(["generate", str(tmp_path), "x", "-o", str(tmp_path / "o.png"), "--quiet"]) == 2
    assert "model_index.json" in capsys.readouterr().err
    assert main(["generate", str(root), "x", "--height", "20", "-o", str(tmp_path / "o.png"), "--quiet"]) == 2
    assert "multiples of 8" in capsys.readouterr().err
    assert main(["generate", str(root), "x", "--scheduler", "heun", "-o", str(tmp_path / "o.png"), "--quiet"]) == 2
    assert "unknown scheduler" in capsys.readouterr().err


def test_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "diffusion", "generate", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--init-image" in r.stdout

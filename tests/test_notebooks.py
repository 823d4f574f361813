"""The notebooks: each one runs top to bottom without an error, and each is stored with its outputs
cleared (run `python tests/test_notebooks.py --clear` to clear them before committing)."""
from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def need(module: str):
    """Import a docs-extra package: skip without it locally, fail without it in CI."""
    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path, monkeypatch):
    nbformat, nbclient = need("nbformat"), need("nbclient")
    need("ipykernel")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{path.name}: a cell failed:\n{e}", pytrace=False)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_outputs_are_cleared(path):
    nb = json.loads(path.read_text())
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, (f"{path.name}: cells {dirty} have outputs; run "
                       f"`python tests/test_notebooks.py --clear` before committing")
    assert "widgets" not in nb.get("metadata", {}), f"{path.name}: holds widget state; clear it"


def clear(paths) -> None:
    """Strip outputs, execution counts and widget state in place."""
    for p in paths:
        nb = json.loads(Path(p).read_text())
        for c in nb["cells"]:
            if c["cell_type"] == "code":
                c["outputs"], c["execution_count"] = [], None
        nb.get("metadata", {}).pop("widgets", None)
        Path(p).write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] != ["--clear"]:
        sys.exit("usage: python tests/test_notebooks.py --clear [NOTEBOOK ...]")
    clear(sys.argv[2:] or NOTEBOOKS)

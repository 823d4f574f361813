"""Notebook display: an HTML summary of a tensor (values shown only once evaluated)."""
from __future__ import annotations

import html

import numpy as np


def tensor_html(t) -> str:
    head = f"<b>Tensor</b> shape={html.escape(str(t.shape))} dtype={t.dtype.name}"
    if t._value is None:
        what = t.op.name if t.op is not None else "input"
        return f"<div>{head} <i>lazy: {html.escape(what)}</i></div>"
    body = np.array2string(np.asarray(t._value), threshold=100, edgeitems=4)
    return f"<div>{head}<pre>{html.escape(body)}</pre></div>"

"""The optional extras of ``pyproject.toml`` and the install hint for a module one of them
provides: ``witcert demo`` without ``transformers`` is the one line
``witcert demo: error: needs 'transformers' (the 'model' extra): pip install 'witcert[model]'``,
not a traceback."""

from __future__ import annotations

#: top-level module → the extra that installs it
EXTRA_OF = {
    "transformers": "model", "gguf": "model", "accelerate": "model", "matplotlib": "model", "tqdm": "model",
    "prometheus_client": "metrics", "sglang": "sglang",
}


def install_hint(module: str) -> str:
    top = module.split(".")[0]
    extra = EXTRA_OF.get(top)
    return f"needs {top!r} (the {extra!r} extra): pip install 'witcert[{extra}]'"


def missing_extra(exc: BaseException) -> str | None:
    """The optional module whose absence raised ``exc`` (walking its causes), else None."""
    seen = 0
    e = exc
    while e is not None and seen < 8:
        name = getattr(e, "name", None) if isinstance(e, ImportError) else None
        if name and name.split(".")[0] in EXTRA_OF:
            return name.split(".")[0]
        e = e.__cause__ or e.__context__
        seen += 1
    return None

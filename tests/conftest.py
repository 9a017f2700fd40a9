"""Test configuration: CPU-only, single-threaded, Triton in interpreter mode, a --soak option."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Kernels run in Triton's interpreter on the CPU unless WITCERT_DEVICE=cuda (the H200 runs).
if os.environ.get("WITCERT_DEVICE", "cpu") != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede any `import triton`

import pytest
from hypothesis import HealthCheck, settings

# the shared helpers' asserts (tests.helpers.conformance.check_case, ...) report as the test modules' do
pytest.register_assert_rewrite("tests.helpers")

# the interpreter without its per-helper-call re-patching (WITCERT_TEST_PLAIN_INTERPRETER=1: Triton's as it is)
if os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("WITCERT_TEST_PLAIN_INTERPRETER") != "1":
    from tests.helpers.interpreter_calls import install as _install_interpreter_calls

    _install_interpreter_calls()

settings.register_profile(
    "ci", max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_addoption(parser):
    parser.addoption("--soak", action="store_true", default=False, help="run the >= 1e6-trial soak tests")


def pytest_configure(config):
    config.addinivalue_line("markers", "soak: long soak test, run only with --soak")
    config.addinivalue_line("markers", "default_window: the cache's library default exact window (contract.sketch.DEFAULT_WINDOW) stays on")
    config.addinivalue_line("markers", "interpreter: the kernel path on a CPU model through Triton's interpreter; "
                                       "skipped in the device run (WITCERT_DEVICE=cuda), where bench/tightness_gpu.py "
                                       "meters the model on the kernel path")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("WITCERT_DEVICE", "cpu") == "cuda":
        cpu_model = pytest.mark.skip(reason="a CPU model through Triton's interpreter (off in the device run)")
        for item in items:
            if "interpreter" in item.keywords:
                item.add_marker(cpu_model)
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="soak test: run with --soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the embedded SmolLM2-135M-Instruct, loaded once per session (the
    first load on a machine converts the GGUF into the user cache, ~20 s)."""
    pytest.importorskip("transformers")
    from tests.helpers.embedded import skip_without_embedded_model

    skip_without_embedded_model()
    from witcert.model import load_model

    return load_model()


@pytest.fixture(scope="session", autouse=True)
def _no_default_window():
    """The suite's caches default to **no** exact window: its tiny models and prompts (tens of tokens)
    would otherwise be served exact end to end (the library default keeps the first 4 and last 64 tokens
    exact), and every test of the compressed path would pass vacuously. Session-wide, so module- and
    session-scoped fixtures get it too. Tests of the window pass ``window=`` explicitly or carry
    ``@pytest.mark.default_window`` (``_library_default_window``)."""
    import witcert.cache

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(witcert.cache, "CACHE_DEFAULT_WINDOW", None)
        yield


@pytest.fixture(autouse=True)
def _library_default_window(request, monkeypatch):
    if "default_window" in request.keywords:
        import witcert.cache
        from contract.sketch import DEFAULT_WINDOW

        monkeypatch.setattr(witcert.cache, "CACHE_DEFAULT_WINDOW", DEFAULT_WINDOW)

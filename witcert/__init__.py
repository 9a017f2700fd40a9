"""WitCert: a provably sound runtime meter for KV-cache quantization (see SPEC.md)."""

__version__ = "0.1.0"

#: the modules of WitCert's own top-level ``kernels`` package (Triton); PyPI has an unrelated
#: package of the same name (Hugging Face's ``kernels``) that can shadow it
_KERNEL_MODULES = ("paged.py", "fp_bounds.py", "repair.py", "exact_window.py", "memory_accounting.py", "write.py",
                   "plan.py", "decode.py", "decode_kernel.py", "decode_steps.py", "decode_program.py", "decode_tile.py",
                   "decode_meter.py", "key_levels.py", "epilogue.py", "epilogue_jit.py", "epilogue_torch.py", "ids.py", "tilt_batch.py")


def _check_kernels_package() -> None:
    """Refuse to start when ``import kernels`` would not find WitCert's Triton kernels (another
    package named ``kernels`` earlier on ``sys.path``, or merged into the same folder), instead of a
    puzzling ``No module named 'kernels.write'`` deep inside the cache. Finds the package without
    importing it (a path lookup)."""
    import importlib.util
    import pathlib
    import sys

    mod = sys.modules.get("kernels")
    try:
        spec = mod.__spec__ if mod is not None else importlib.util.find_spec("kernels")
    except (ImportError, ValueError):
        spec = None
    where = list(getattr(spec, "submodule_search_locations", None) or []) if spec is not None else []
    ok = False
    for d in where:
        d = pathlib.Path(d)
        init = d / "__init__.py"
        if all((d / m).is_file() for m in _KERNEL_MODULES) and init.is_file():
            ok = "WitCert" in init.read_text(errors="replace")[:400]
        break  # the first location is the one Python imports from
    if not ok:
        found = "no package named 'kernels'" if spec is None else f"a package 'kernels' at {where[0] if where else spec.origin}"
        raise ImportError(
            f"witcert needs its own top-level 'kernels' package (WitCert's Triton kernels), but Python finds {found}, "
            "which is not it. PyPI's unrelated 'kernels' package (Hugging Face) uses the same name: uninstall it "
            "(pip uninstall kernels) and reinstall witcert (pip install --force-reinstall --no-deps witcert), "
            "or use separate virtual environments.")


_check_kernels_package()

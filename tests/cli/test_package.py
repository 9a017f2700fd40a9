"""Packaging (issue 34): the built wheel holds every module, installs on its own and runs; the
dependency pins are ranges; the shadowing ``kernels`` package of PyPI is refused with a message."""

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("contract", "witcert", "kernels", "proofs_bridge")


def _source_modules() -> set[str]:
    """Every module of the shipped packages in the checkout, as dotted names."""
    out = set()
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            out.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", TRITON_INTERPRET="1", **extra)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    """The wheel built from a copy of the project's files (no build/ or egg-info in the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for f in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / f, src / f)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                        "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, env=_clean_env(), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = (tmp / "dist").glob("witcert-*.whl")
    return whl


def test_wheel_holds_every_module_and_the_license(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    mods = {n[:-3].replace("/", ".").removesuffix(".__init__") for n in names if n.endswith(".py")}
    assert mods == _source_modules()
    assert "witcert/integrations/sglang.py" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "bench/")) for n in names)


def test_wheel_installs_alone_imports_everything_and_runs(wheel, tmp_path):
    """The wheel in a fresh venv (--no-deps; torch and the rest come from this environment's
    site-packages by a .pth), away from the checkout: every module imports, ``witcert --help`` runs."""
    import site
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                        str(wheel)], capture_output=True, text=True, env=_clean_env(), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # this environment's site-packages after the venv's own (where the wheel went); a plain path
    # entry, so the checkout's editable install (its own .pth files there) is not activated
    deps = [p for p in [sysconfig.get_paths()["purelib"], *site.getsitepackages()] if pathlib.Path(p).is_dir()]
    (pathlib.Path(purelib) / "zz_test_deps.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
    mods = sorted(m for m in _source_modules() if not m.endswith("__main__"))
    code = ("import importlib, pathlib, sys\n"
            f"for m in {mods!r}:\n"
            "    mod = importlib.import_module(m)\n"
            f"    assert pathlib.Path(mod.__file__).is_relative_to({str(venv)!r}), (m, mod.__file__)\n"
            "print(len(sys.modules))\n")
    r = subprocess.run([str(py), "-c", code], cwd=tmp_path, capture_output=True, text=True, env=_clean_env(), timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([str(venv / "bin" / "witcert"), "--help"], cwd=tmp_path, capture_output=True, text=True,
                       env=_clean_env(), timeout=120)
    assert r.returncode == 0 and "trace" in r.stdout, r.stderr[-3000:]
    r = subprocess.run([str(venv / "bin" / "witcert"), "trace", "schema"], cwd=tmp_path, capture_output=True, text=True,
                       env=_clean_env(), timeout=120)
    assert r.returncode == 0 and "| `tv` | float |" in r.stdout, r.stderr[-3000:]


def test_dependencies_are_ranges_and_ci_installs_the_tested_versions():
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = meta["dependencies"] + [r for v in meta["optional-dependencies"].values() for r in v]
    by_name = {r.split(";")[0].split("=")[0].split(">")[0].split("<")[0].strip(): r for r in reqs}
    for name in ("torch", "triton", "transformers"):
        assert "==" not in by_name[name].split(";")[0], by_name[name]
    make = (ROOT / "Makefile").read_text()
    for pin in ("torch==2.13.0", "triton==3.7.1", "transformers==5.23.0"):
        assert f"'{pin}'" in make
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License") and meta["license"] == "Apache-2.0"


def test_a_shadowing_kernels_package_is_refused_with_a_message(tmp_path):
    fake = tmp_path / "kernels"
    fake.mkdir()
    (fake / "__init__.py").write_text('"""Hugging Face kernels (stand-in)."""\n')
    r = subprocess.run([sys.executable, "-c", "import witcert"], cwd=tmp_path, capture_output=True, text=True,
                       env=_clean_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}"), timeout=60)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError:") and str(fake) in last and "pip uninstall kernels" in last
    r = subprocess.run([sys.executable, "-c", "import witcert, kernels; print(kernels.__file__)"], cwd=ROOT,
                       capture_output=True, text=True, env=_clean_env(PYTHONPATH=str(ROOT)), timeout=60)
    assert r.returncode == 0 and pathlib.Path(r.stdout.strip()) == ROOT / "kernels" / "__init__.py"

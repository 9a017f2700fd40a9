"""Rough edges of the command line and the Python API (issue 34): each failed with a traceback, a
raw warning, a silent side effect or a wrong message before."""

import ast
import json
import os
import pathlib
import shutil
import subprocess
import sys
import warnings

import pytest

from witcert import cli
from witcert.trace import TraceError, TraceWarning, read_trace

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "data" / "tiny.trace.jsonl"


def one_error_line(capsys, needle):
    cap = capsys.readouterr()
    lines = [x for x in cap.err.splitlines() if x.strip()]
    assert len(lines) == 1 and "error:" in lines[0] and needle in lines[0], cap.err
    assert "Traceback" not in cap.err
    return lines[0]


# --------------------------------------------------------------------------- piping
def test_a_closed_pipe_ends_quietly_with_141():
    """`witcert trace schema | head -0`: the reader is gone before the first write."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "witcert.cli", "trace", "schema"], stdout=w, stderr=subprocess.PIPE,
                           text=True, cwd=ROOT, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.close(w)
    assert p.returncode == 141, p.stderr
    assert p.stderr == ""


# --------------------------------------------------------------------------- trace verbs
def test_plot_with_no_matching_rows_is_one_error_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "plots"
    assert cli.main(["trace", "plot", str(FIXTURE), "--out", str(out), "--where", "layer > 100"]) == 2
    one_error_line(capsys, "no rows")
    assert not out.exists()
    from witcert.traceplot import plot
    from witcert.traceviews import ViewError

    with pytest.raises(ViewError, match="field 'scheme' is not numeric"):
        plot(read_trace(FIXTURE), out, field="scheme")
    assert not out.exists()


def test_a_non_numeric_field_names_the_line(tmp_path, capsys):
    lines = FIXTURE.read_text().splitlines(keepends=True)
    row = json.loads(lines[3])
    row["tv"] = "high"
    lines[3] = json.dumps(row) + "\n"
    bad = tmp_path / "bad.trace.jsonl"
    bad.write_text("".join(lines))
    with pytest.raises(TraceError, match=r"bad.trace.jsonl:4: field 'tv': expected a number"):
        read_trace(bad)
    assert cli.main(["trace", "summary", str(bad)]) == 2
    one_error_line(capsys, ":4: field 'tv'")
    for field, value in (("layer", 1.5), ("saturated", 1), ("scheme", 3), ("step", True)):
        row = json.loads(FIXTURE.read_text().splitlines()[1])
        row[field] = value
        bad.write_text(FIXTURE.read_text().splitlines(keepends=True)[0] + json.dumps(row) + "\n")
        with pytest.raises(TraceError, match=f":2: field '{field}'"):
            read_trace(bad)


def test_a_torn_line_is_one_warning_line_not_a_raw_userwarning(tmp_path, capsys):
    data = FIXTURE.read_bytes()
    torn = tmp_path / "torn.trace.jsonl"
    torn.write_bytes(data + data.splitlines(keepends=True)[1][:40])
    with pytest.warns(TraceWarning, match="torn last line"):
        t = read_trace(torn)
    assert t.skipped_torn == 1 and len(t) == len(read_trace(FIXTURE))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # anything but the CLI's own line would raise here
        assert cli.main(["trace", "summary", str(torn)]) == 0
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("witcert trace summary: warning: trace ") and "torn" in err[0]


def test_summary_of_a_folder_says_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["trace", "summary", str(tmp_path)])
    assert e.value.code == 2
    one_error_line(capsys, "is a folder, expected a file")
    with pytest.raises(TraceError, match="is a folder"):
        read_trace(tmp_path)


# --------------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize("argv,needle", [
    (["demo", "--trace", "/nonexistent-witcert/dir/x.trace.jsonl"], "no such folder"),
    (["demo", "--prometheus-file", "/nonexistent-witcert/m.prom"], "no such folder"),
    (["eval", "--tau", "2"], "--tau"),
    (["eval", "--tau", "-0.1"], "--tau"),
])
def test_bad_arguments_exit_2_and_create_nothing(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    one_error_line(capsys, needle)
    assert not pathlib.Path("/nonexistent-witcert").exists()


def test_eval_tau_in_range_parses():
    assert cli.build_parser().parse_args(["eval", "--tau", "0.9"]).tau == 0.9


# --------------------------------------------------------------------------- optional extras
def test_a_missing_extra_is_an_install_hint(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ModuleNotFoundError
    assert cli.main(["trace", "plot", str(FIXTURE), "--out", str(tmp_path / "p")]) == 2
    line = one_error_line(capsys, "pip install 'witcert[model]'")
    assert line.startswith("witcert trace plot: error: needs 'matplotlib'")
    from witcert.extras import install_hint, missing_extra
    from witcert.metrics import PrometheusMetrics

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"pip install 'witcert\[metrics\]'") as ei:  # the API: names the extra
        PrometheusMetrics()
    assert missing_extra(ei.value) == "prometheus_client"
    assert install_hint("transformers.cache_utils") == "needs 'transformers' (the 'model' extra): pip install 'witcert[model]'"
    assert missing_extra(ImportError("x", name="numpy")) is None


# --------------------------------------------------------------------------- schemes and models
def test_scheme_aliases_come_from_the_scheme_table():
    from contract.schemes import ALIASES, SCHEMES
    from witcert import argtypes
    from witcert.schemes import resolve_scheme

    assert argtypes.SCHEME_ALIASES is ALIASES and set(ALIASES.values()) <= set(SCHEMES)
    assert resolve_scheme("fp8") == "fp8_e4m3" and resolve_scheme("int4") == "int4_group"
    assert resolve_scheme("kivi2") == "kivi2" and resolve_scheme("auto") == "none"
    with pytest.raises(ValueError, match="aliases: auto = none, fp8 = fp8_e4m3"):
        resolve_scheme("fp9")


def test_the_cache_accepts_the_cli_alias_fp8():
    from tests.helpers.tiny import tiny_model
    from witcert.cache import WitCertCache

    assert WitCertCache(tiny_model().config, scheme="fp8").scheme == "fp8_e4m3"


def gemma2_config():
    from transformers import Gemma2Config

    return Gemma2Config(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=32, vocab_size=256)


def test_logit_softcapping_is_refused_by_name(tmp_path, capsys):
    from witcert.model import check_supported_config

    cfg = gemma2_config()
    assert cfg.attn_logit_softcapping == 50.0
    with pytest.raises(NotImplementedError, match=r"gemma2: attention logit soft-capping \(attn_logit_softcapping=50.0"):
        check_supported_config(cfg)
    with pytest.raises(NotImplementedError):
        check_supported_config({"model_type": "x", "text_config": {"attn_logit_softcapping": 30.0}})
    check_supported_config({"model_type": "gemma2", "attn_logit_softcapping": None})  # capping off: fine
    from tests.helpers.tiny import tiny_model

    check_supported_config(tiny_model().config)  # Llama: nothing to refuse
    (tmp_path / "config.json").write_text(cfg.to_json_string())
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", "--model", str(tmp_path)])
    assert e.value.code == 2
    one_error_line(capsys, "soft-capping")


def test_the_cache_refuses_logit_softcapping():
    from witcert.cache import WitCertCache

    try:
        WitCertCache(gemma2_config(), scheme="int8")
    except NotImplementedError as e:
        assert "soft-capping" in str(e)
    else:
        raise AssertionError("WitCertCache accepted a Gemma-2 config")


# --------------------------------------------------------------------------- README and repository
def _python_blocks(section: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [b.split("```", 1)[0] for b in body.split("```python\n")[1:]]


def test_readme_metering_snippets_define_every_name():
    """The "Metering a model" snippets, read in order, use no name they do not define (``ids``
    and ``mask`` were missing)."""
    import builtins

    blocks = _python_blocks("Metering a model")
    assert len(blocks) >= 2
    defined = set(dir(builtins))
    for code in blocks:
        tree = ast.parse(code)
        for node in ast.walk(tree):  # every binding of the block (the snippets are straight-line code)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        assert used <= defined, f"undefined in the README snippet: {sorted(used - defined)}"


def test_the_demo_output_folder_is_git_ignored():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for p in ("witcert-demo/results.json", "witcert-demo/risk_heatmap.png", "quality.json"):
        r = subprocess.run(["git", "check-ignore", "-q", p], cwd=ROOT, timeout=30)
        assert r.returncode == 0, f"{p} is not git-ignored"

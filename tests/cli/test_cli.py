"""The command line fails early: every bad value is one error line, exit status 2, before any
model work, and nothing is written or overwritten."""

import pytest

from witcert import __version__, cli

BAD = [
    (["demo", "--tokens", "0"], "--tokens"),
    (["demo", "--tokens", "abc"], "--tokens"),
    (["demo", "--new-tokens", "1"], "--new-tokens"),
    (["demo", "--out", "/proc/x"], "--out"),
    (["demo", "--scheme", "fp9"], "unknown scheme"),
    (["demo", "--scheme", "auto"], "at least one compressed scheme"),
    (["demo", "--dtype", "float8"], "--dtype"),
    (["demo", "--device", "tpu"], "--device"),
    (["demo", "--trace-where", "__import__('os')"], "--trace-where"),
    (["demo", "--trace-sample", "0"], "--trace-sample"),
    (["demo", "--prometheus", "70000"], "--prometheus"),
    (["demo", "--model", "/nonexistent"], "--model"),
    (["demo", "--steps", "3"], "need --synthetic"),
    (["demo", "--synthetic", "--steps", "0"], "--steps"),
    (["demo", "--synthetic", "--lengths", "abc"], "--lengths"),
    (["demo", "--synthetic", "--lengths", "1024,"], "--lengths"),
    (["eval", "--", "--seeds", "0"], "--seeds"),
    (["eval", "--seeds", "0"], "--seeds"),
    (["eval", "--lengths", "abc"], "--lengths"),
    (["eval", "--lengths", "-5"], "--lengths"),
    (["eval", "--tasks", "single,nope"], "unknown task"),
    (["eval", "--tau", "nan"], "--tau"),
    (["eval", "--min-share", "2"], "--min-share"),
    (["eval", "--json", "/proc/q.json"], "--json"),
    (["eval", "--layers", "3"], "need --sweep-layers"),
    (["eval", "--sweep-layers", "--schemes", "auto"], "needs a compressed scheme"),
    (["eval", "--sweep-layers", "--layers", "x-y"], "--layers"),
    (["eval", "--sweep-layers", "--layers", "0-30"], "layers 0-29"),
    (["trace", "summary", "/nonexistent.jsonl"], "no such file"),
    (["trace", "top", "tests/data/tiny.trace.jsonl", "--where", "tv > 0.1; import os"], "--where"),
    (["trace", "summary", "tests/data/tiny.trace.jsonl", "--by", "tv"], "--by"),
    (["trace", "plot", "tests/data/tiny.trace.jsonl"], "--out"),
    (["nosuch"], "invalid choice"),
]


@pytest.mark.parametrize("argv,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_exits_2_with_one_line(argv, needle, capsys, monkeypatch):
    import witcert.model

    def no_model(*a, **k):
        raise AssertionError("model work started before the arguments were checked")

    monkeypatch.setattr(witcert.model, "load_model", no_model)
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    cap = capsys.readouterr()
    lines = [x for x in cap.err.splitlines() if x.strip()]
    assert len(lines) == 1 and "error:" in lines[0] and needle in lines[0], cap.err
    assert "Traceback" not in cap.err and cap.out == ""


def test_nothing_written_or_overwritten_on_bad_input(tmp_path, capsys):
    out = tmp_path / "new" / "demo"
    with pytest.raises(SystemExit):
        cli.main(["demo", "--out", str(out), "--tokens", "0"])
    assert not (tmp_path / "new").exists()
    js = tmp_path / "q.json"
    js.write_text("[1]")
    with pytest.raises(SystemExit):
        cli.main(["eval", "--json", str(js), "--seeds", "0"])
    assert js.read_text() == "[1]"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.json"]  # no probe files left behind


def test_eval_flags_without_dashes_and_in_help(capsys):
    ap = cli.build_parser()
    a = ap.parse_args(["eval", "--lengths", "128", "--seeds", "1", "--schemes", "fp8,int4", "--tasks", "single"])
    assert a.lengths == [128] and a.seeds == 1 and a.schemes == ["fp8_e4m3", "int4_group"] and a.tasks == ["single"]
    with pytest.raises(SystemExit) as e:
        cli.main(["eval", "--help"])
    assert e.value.code == 0
    helptext = capsys.readouterr().out
    for flag in ("--lengths", "--seeds", "--schemes", "--tasks", "--json", "--sweep-layers", "--layers"):
        assert flag in helptext


def test_old_eval_spelling_still_parses(monkeypatch):
    seen = {}
    monkeypatch.setattr("witcert.quality.run", lambda args: seen.setdefault("args", args) and 0)
    cli.main(["eval", "--", "--lengths", "256", "--seeds", "2"])
    assert seen["args"].lengths == [256] and seen["args"].seeds == 2


def test_demo_scheme_device_dtype_parse():
    a = cli.build_parser().parse_args(["demo", "--scheme", "fp8,int8,kivi2", "--device", "cpu", "--dtype", "bf16"])
    assert a.scheme == ["fp8_e4m3", "int8", "kivi2"] and a.device == "cpu" and a.dtype == "bfloat16"
    import torch

    from witcert.demo import resolve_dtype

    assert resolve_dtype("auto", "cpu") == torch.float32 and resolve_dtype("auto", "cuda") == torch.bfloat16
    assert resolve_dtype(a.dtype, a.device) == torch.bfloat16


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"witcert {__version__}"

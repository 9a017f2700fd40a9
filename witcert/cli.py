"""``witcert`` command line.

``witcert demo``: generates on the embedded SmolLM2-135M with a compressed, metered and gated
KV cache (``witcert.demo``); ``--scheme``, ``--device``, ``--dtype``, ``--trace``,
``--prometheus``. ``witcert demo --synthetic``: the synthetic decode workload (heavy-tailed
logits, sink tokens, outlier key channels), bounds next to the realised TV.
``witcert eval``: the quality evaluation (``bench/quality.py`` runs the same code);
``witcert eval --sweep-layers``: the layer sweep (``witcert.sweep``).
``witcert trace summary|top|compare|plot|schema``: views of a recorded trace (``witcert.trace``).

Every argument is checked while parsing, before any model work: a bad value is one error
line and exit status 2 (``witcert.argtypes``). So is a missing optional package (the install
hint of its extra, ``witcert.extras``). A trace repaired on reading (a torn last line) is one
``warning:`` line. Output piped into a reader that stops early (``| head``) ends quietly with
status 141 (128 + SIGPIPE), as a shell tool does.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

from contract.sketch import DEFAULT_WINDOW, SKETCH_BOXES

from . import __version__
from . import argtypes as A

SYNTHETIC_SCHEMES = ["fp8_e4m3", "fp8_e4m3_scaled", "int8", "int8_dither", "int4_group", "kivi2"]


def _sinks(args):
    """The --trace / --prometheus sinks of the demo (None when neither is asked for)."""
    from .trace import Tee, Tracer

    sinks = []
    if args.trace:
        sinks.append(Tracer(args.trace, sample_every=args.trace_sample, min_tv=args.trace_min_tv, where=args.trace_where,
                            meta={"command": "witcert demo", "model": str(args.model or "embedded SmolLM2-135M"),
                                  "tokens": args.tokens, "device": args.device, "dtype": args.dtype}))
    if args.prometheus is not None or args.prometheus_file:
        from .metrics import PrometheusMetrics

        m = PrometheusMetrics(model=str(args.model or "embedded SmolLM2-135M"))
        if args.prometheus is not None:
            m.serve(args.prometheus)
        sinks.append(m)
    return (Tee(*sinks) if len(sinks) > 1 else sinks[0]) if sinks else None, sinks


def _demo(args) -> int:
    if not args.synthetic:
        from .demo import DEMO_SCHEMES, run

        sink, sinks = _sinks(args)
        try:
            res = run(tokens=args.tokens, seed=args.seed, new_tokens=args.new_tokens, out=args.out, model_path=args.model,
                      schemes=args.scheme or list(DEMO_SCHEMES), device=args.device, dtype=args.dtype, trace=sink,
                      gated=not args.no_gate)
        finally:
            for s in sinks:
                if hasattr(s, "close"):
                    s.close()
        for s in sinks:
            if hasattr(s, "write_textfile") and args.prometheus_file:
                s.write_textfile(args.prometheus_file)
                print(f"prometheus metrics: {args.prometheus_file}")
            if hasattr(s, "rows_written"):
                print(f"trace: {s.rows_written} rows in {s.path}")
        bad = sum(r.get("violations", 0) for r in res["rows"])
        return 1 if bad else 0
    from .synthetic import coverage_table, run_workload

    schemes = args.scheme or SYNTHETIC_SCHEMES
    schemes = [s for s in schemes if s != "none"]
    lengths = args.lengths
    print(f"WitCert demo: synthetic decode, d=128, per-token witnesses (G=4), n in {lengths}, {args.steps} steps each")

    def progress(done, total):
        print(f"\r  metered {done}/{total} steps", end="", file=sys.stderr, flush=True)

    res = []
    for wl, oc, ostd in (("plain", 0, 0.0), ("outlier", 4, 12.0)):
        res += run_workload(schemes, lengths, args.steps, outlier_channels=oc, outlier_std=ostd, workload=wl, progress=progress)
    print(file=sys.stderr)
    print(coverage_table(res))
    viol = sum(not (r.realised_tv <= min(r.tanh, r.eform, r.tilt)) for r in res)
    print(f"Every bound was checked against the realised TV on {len(res)} metered steps: {viol} violations.")
    print("Tier B (int8_dither) holds for non-adaptive queries; Tier A holds always.")
    return 1 if viol or not res else 0


def _eval(args) -> int:
    from .quality import run

    return run(args)


def _tightness(args) -> int:
    from .tightness import main

    return main(args)


def _window(s: str):
    """--window SINK,RECENT (two non-negative ints; 0,0 for none)."""
    parts = s.split(",")
    try:
        vals = tuple(int(p.strip()) for p in parts)
    except ValueError:
        vals = ()
    if len(vals) != 2 or min(vals) < 0:
        raise argparse.ArgumentTypeError(f"expected SINK,RECENT (two non-negative ints, e.g. 4,64 or 0,0), got {s!r}")
    return vals


# --------------------------------------------------------------------------- trace verbs
def _trace(args) -> int:
    from .predicate import PredicateError
    from .trace import TraceError, read_trace, schema_markdown
    from .traceviews import ViewError

    try:
        if args.verb == "schema":
            print(schema_markdown())
            return 0
        from . import traceviews as V

        if args.verb == "compare":
            a = read_trace(args.trace_a).where(args.where).where(args.where_a)
            b = read_trace(args.trace_b).where(args.where).where(args.where_b)
            la = args.label_a or _label(args.trace_a, args.where_a)
            lb = args.label_b or _label(args.trace_b, args.where_b)
            print(V.format_compare(V.compare(a, b, by=args.by, field=args.field, taus=args.tau, labels=(la, lb))))
            return 0
        t = read_trace(args.trace).where(args.where)
        if args.verb == "summary":
            print(V.format_summary(V.summarize(t, by=args.by, field=args.field, taus=args.tau, worst=args.worst)))
        elif args.verb == "top":
            print(V.format_top(V.top(t, k=args.k, field=args.field), args.field))
        elif args.verb == "plot":
            from .traceplot import KINDS, plot

            files = plot(t, args.out, kinds=KINDS if args.kind == ["all"] else args.kind, field=args.field)
            for f in files:
                print(f)
        return 0
    except (TraceError, ViewError, PredicateError) as e:  # ViewError: also the plot's "no rows"
        print(f"witcert trace {args.verb}: error: {e}", file=sys.stderr)
        return 2


def _label(path, where):
    return f"{path}" + (f" [{where}]" if where else "")


def _by(s: str) -> tuple:
    from .traceviews import ViewError, _check_by

    try:
        return _check_by(tuple(p.strip() for p in s.split(",")))
    except ViewError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _field(s: str) -> str:
    from .trace import FIELD_BY_NAME

    f = FIELD_BY_NAME.get(s)
    if f is None or f.kind not in ("float", "int"):
        raise argparse.ArgumentTypeError(f"expected a numeric trace field, got {s!r}")
    return s


def _kinds(s: str) -> list[str]:
    from .traceplot import KINDS

    return A.choice_list(("all",) + KINDS, "plot kind")(s)


def build_parser() -> A.OneLineParser:
    ap = A.OneLineParser(prog="witcert", description="Sound runtime meter for KV-cache quantization")
    ap.add_argument("--version", action="version", version=f"witcert {__version__}")
    ap.add_argument("-v", "--verbose", action="store_true", help="log decisions (INFO)")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{demo,eval,tightness,selftest,trace}")
    d, e, g, t = _add_demo(sub), _add_eval(sub), _add_tightness(sub), _add_trace(sub)
    s = _add_selftest(sub)
    ap.subcommands = {"demo": d, "eval": e, "tightness": g, "selftest": s, "trace": t}
    return ap


def _add_demo(sub) -> A.OneLineParser:
    """``witcert demo``: meter and gate a compressed KV cache on the embedded model (or the synthetic workload)."""
    d = sub.add_parser("demo", help="meter and gate a compressed KV cache on the embedded model")
    d.add_argument("--tokens", type=A.int_at_least(64), default=2000, help="prompt length (needle in a haystack), >= 64")
    d.add_argument("--new-tokens", type=A.int_at_least(2), default=10,
                   help="tokens generated, >= 2 (the first comes from the exact prefill); the needle's answer takes 7 "
                        "(SmolLM2), with fewer the task is reported n/a")
    d.add_argument("--seed", type=A.int_at_least(0), default=0)
    d.add_argument("--scheme", type=A.scheme_list, default=None,
                   help="KV scheme(s), comma-separated (default: fp8_e4m3,int4_group,kivi2,int8_dither); "
                        "--kv-cache-dtype-style aliases: fp8 (= fp8_e4m3), int8, int4 (= int4_group), auto (exact only)")
    d.add_argument("--no-gate", action="store_true", help="run the ungated configs only")
    d.add_argument("--device", type=A.device, default="cpu",
                   help="cpu, cuda[:N] or auto; on CUDA the ungated kernel-scheme configs run on the Triton kernels")
    d.add_argument("--dtype", type=A.dtype_name, default="auto",
                   help="model dtype: float32, float16, bfloat16 (auto: float32 on the CPU, bfloat16 on CUDA)")
    d.add_argument("--out", type=A.out_dir, default="witcert-demo", help="folder for the plots and results.json")
    d.add_argument("--model", type=A.model_dir, default=None, help="a local Hugging Face model folder (default: embedded SmolLM2)")
    d.add_argument("--trace", type=A.out_file, default=None, help="append the trace (JSON Lines, witcert.trace) to this file")
    d.add_argument("--trace-sample", type=A.int_at_least(1), default=1, help="--trace: keep steps with step %% N == 0")
    d.add_argument("--trace-min-tv", type=A.float_in(0.0, 1.0), default=None, help="--trace: keep rows with TV+ (before repair) > this")
    d.add_argument("--trace-where", type=A.predicate, default=None, help="--trace: keep rows matching, e.g. 'layer>=20 and tv>0.1'")
    d.add_argument("--prometheus", type=A.int_at_least(1, 65535), default=None, metavar="PORT",
                   help="serve Prometheus metrics on this port while the demo runs (off by default)")
    d.add_argument("--prometheus-file", type=A.out_file, default=None,
                   help="write the Prometheus metrics (text format) to this file at the end")
    d.add_argument("--synthetic", action="store_true", help="the synthetic workload instead of the model")
    d.add_argument("--lengths", type=A.int_list(16), default=[1024, 4096, 16384], help="--synthetic: context lengths (>= 16)")
    d.add_argument("--steps", type=A.int_at_least(1), default=8, help="--synthetic: steps per length (>= 1)")
    d.set_defaults(func=_demo)
    return d


def _add_eval(sub) -> A.OneLineParser:
    """``witcert eval``: its arguments are ``witcert.quality``'s."""
    from .quality import add_eval_arguments

    e = sub.add_parser("eval", help="quality evaluation: accuracy exact / ungated / gated per scheme; --sweep-layers")
    add_eval_arguments(e)
    e.set_defaults(func=_eval)
    return e


def _add_tightness(sub) -> A.OneLineParser:
    """``witcert tightness``: the bound against the realised TV on the embedded model."""
    g = sub.add_parser("tightness", help="the meter's bound against the realised TV on the embedded model (rows, "
                                         "violations, medians, coverage, bytes per token)")
    g.add_argument("--scheme", type=A.one_scheme, default="int8", help="KV scheme (default int8)")
    g.add_argument("--json", action="store_true", help="print the result as JSON")
    g.add_argument("--tokens", type=A.int_at_least(128), default=1024, help="prompt tokens per prompt (>= 128)")
    g.add_argument("--steps", type=A.int_at_least(1), default=2, help="metered decode steps per prompt (>= 1; 2 prompts "
                                                                      "x 2 steps x 30 layers x 9 heads = 1080 rows)")
    g.add_argument("--sketch-bits", type=A.sketch_bits, default=None,
                   help="residual sketch bits: 0, 1, 2 or 4 (default: the scheme's, 2 for the 8-bit schemes, "
                        "4 for int4_group and kivi2)")
    g.add_argument("--window", type=_window, default=None,
                   help=f"exact window SINK,RECENT (default {DEFAULT_WINDOW[0]},{DEFAULT_WINDOW[1]}; 0,0 none)")
    g.add_argument("--weights", choices=("calibrated", "none"), default="calibrated",
                   help="channel weights of the radius: the embedded model's calibration (default) or none (all 1)")
    g.add_argument("--device", type=A.device, default="cpu", help="cpu, cuda[:N] or auto")
    g.add_argument("--backend", choices=("auto", "reference", "kernel"), default="auto",
                   help="the cache's backend (auto: the Triton kernels on CUDA, the float64 reference on the CPU)")
    g.add_argument("--sketch-box", choices=SKETCH_BOXES, default="auto",
                   help="the sketch box: centred (|δ − σ⟨q, r̃⟩| ≤ c_h W, the reference path's default; needs "
                        "--backend reference), symmetric (the kernels' default form), per-head (each query head's "
                        "own symmetric radius, both paths), grid (the centred box unbinned on a fixed (t, λ) grid; "
                        "the reference path)")
    g.set_defaults(func=_tightness)
    return g


def _add_selftest(sub) -> A.OneLineParser:
    """``witcert selftest``: the kernel path's self-checks on this device for a serving configuration."""
    s = sub.add_parser("selftest", help="check the compiled write and metered decode on this device for a serving "
                                        "configuration (what the kernel path checks at first use); exit 1 on a failure")
    s.add_argument("--scheme", type=A.scheme_list, default=["int8"], help="KV scheme(s), comma-separated (default int8)")
    s.add_argument("--device", type=A.device, default="auto", help="cuda[:N], auto, or cpu (needs TRITON_INTERPRET=1)")
    s.add_argument("--dtype", type=A.dtype_name, default="auto", help="the model's dtype (auto: bfloat16 on CUDA)")
    s.add_argument("--head-dim", type=int, choices=(64, 128, 256), default=128)
    s.add_argument("--kv-heads", type=A.int_at_least(1), default=8)
    s.add_argument("--q-heads", type=A.int_at_least(1), default=32, help="a multiple of --kv-heads (GQ ≤ 8)")
    s.add_argument("--batch", type=A.int_at_least(1), default=1, help="sequences per decode call")
    s.add_argument("--context", type=A.int_at_least(16), default=32768, help="the decode's capacity in tokens")
    s.add_argument("--window", type=_window, default=DEFAULT_WINDOW,
                   help=f"exact window SINK,RECENT (default {DEFAULT_WINDOW[0]},{DEFAULT_WINDOW[1]}; 0,0 none)")
    s.add_argument("--sketch-bits", type=A.sketch_bits, default=None, help="0, 1, 2 or 4 (default: the scheme's)")
    s.add_argument("--json", action="store_true", help="print the results as JSON")
    s.set_defaults(func=_selftest)
    return s


def _selftest(args) -> int:
    from .selftest_run import main

    return main(args)


def _add_trace(sub) -> A.OneLineParser:
    """``witcert trace``: its verbs summary, top, compare, plot, schema over a recorded trace."""
    t = sub.add_parser("trace", help="views of a recorded trace: summary, top, compare, plot, schema")
    tv = t.add_subparsers(dest="verb", required=True, metavar="{summary,top,compare,plot,schema}")
    common = A.OneLineParser(add_help=False)
    common.add_argument("--where", type=A.predicate, default=None, help="rows matching, e.g. \"layer>=20 and tv>0.1\"")
    common.add_argument("--field", type=_field, default="tv", help="the bound to rank / summarise (default tv: Tier A TV+ after repair)")
    grp = A.OneLineParser(add_help=False)
    grp.add_argument("--by", type=_by, default=("layer",), help="group by: layer, head, layer,head, config, scheme, req, step ...")
    grp.add_argument("--tau", type=_taus, default=(0.1, 0.5),
                     help="coverage thresholds, e.g. 0.1,0.5")
    s = tv.add_parser("summary", parents=[common, grp], help="per layer / head quantiles, coverage at tau, worst steps")
    s.add_argument("trace", type=A.in_file)
    s.add_argument("--worst", type=A.int_at_least(0), default=5, help="worst (request, step, layer) cells to list")
    s = tv.add_parser("top", parents=[common], help="the riskiest (layer, head, step) rows")
    s.add_argument("trace", type=A.in_file)
    s.add_argument("-k", type=A.int_at_least(1), default=10, help="rows to list")
    s = tv.add_parser("compare", parents=[common, grp], help="two traces side by side (e.g. two schemes)")
    s.add_argument("trace_a", type=A.in_file)
    s.add_argument("trace_b", type=A.in_file)
    s.add_argument("--where-a", type=A.predicate, default=None, help="rows of A (e.g. \"gate==null\")")
    s.add_argument("--where-b", type=A.predicate, default=None, help="rows of B")
    s.add_argument("--label-a", default=None)
    s.add_argument("--label-b", default=None)
    s = tv.add_parser("plot", parents=[common], help="heatmap, risk over steps, risk-coverage, page-ins")
    s.add_argument("trace", type=A.in_file)
    s.add_argument("--out", type=A.out_dir, required=True, help="folder for the PNG files")
    s.add_argument("--kind", type=_kinds, default=["all"], help="all, or some of heatmap,steps,coverage,pageins")
    tv.add_parser("schema", help="print the trace schema")
    t.set_defaults(func=_trace)
    return t


def _taus(s: str) -> tuple:
    one = A.float_in(0.0, 1.0)
    try:
        return tuple(one(x.strip()) for x in s.split(","))
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} (in {s!r})") from None


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    words = [a for a in argv[:2] if not a.startswith("-")][: 2 if argv[:1] == ["trace"] else 1]
    cmd = " ".join(["witcert", *words])  # the prefix of the error / warning lines
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", _trace_warning())
            shown = warnings.showwarning

            def show(message, category, *a, **k):
                if issubclass(category, _trace_warning()):
                    print(f"{cmd}: warning: {message}", file=sys.stderr)
                else:
                    shown(message, category, *a, **k)

            warnings.showwarning = show
            rc = _main(argv)
            sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
            return rc
    except BrokenPipeError:
        # the reader went away (`witcert trace top ... | head`): no traceback, and no second error
        # when Python flushes stdout at exit
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
    except ImportError as e:
        from .extras import install_hint, missing_extra

        mod = missing_extra(e)
        if mod is None:
            raise
        print(f"{cmd}: error: {install_hint(mod)}", file=sys.stderr)
        return 2


def _trace_warning():
    from .trace import TraceWarning

    return TraceWarning


def _main(argv) -> int:
    if len(argv) >= 2 and argv[0] == "eval" and argv[1] == "--":  # the old `witcert eval -- ...` spelling
        argv.pop(1)
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.cmd == "eval":
        from .quality import check_eval_args

        check_eval_args(ap.subcommands["eval"], args)
    if args.cmd == "demo" and not args.synthetic and (args.lengths != [1024, 4096, 16384] or args.steps != 8):
        ap.subcommands["demo"].error("--lengths and --steps need --synthetic")
    if args.cmd == "demo" and args.scheme is not None and all(x == "none" for x in args.scheme):
        ap.subcommands["demo"].error("argument --scheme: the demo needs at least one compressed scheme (not only auto / none)")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

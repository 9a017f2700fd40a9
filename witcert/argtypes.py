"""Argument types of the ``witcert`` command line: every value is checked while parsing, before
any model work, and a bad one is an argparse error (one line, exit status 2, no traceback).

``OneLineParser`` is an ``argparse.ArgumentParser`` whose errors are the single line
``witcert demo: error: argument --tokens: expected an integer >= 64, got '0' (see witcert demo --help)``.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import tempfile

#: ``--kv-cache-dtype``-style aliases (vLLM spells fp8 caches this way) → witcert schemes: the
#: scheme table's (``contract.schemes.ALIASES``), which the Python API accepts too
from contract.schemes import ALIASES as SCHEME_ALIASES


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def int_at_least(lo: int, hi: int | None = None):
    def parse(s: str) -> int:
        try:
            v = int(s)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
        if v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise argparse.ArgumentTypeError(f"expected an integer {rng}, got {s!r}")
        return v

    parse.__name__ = "integer"
    return parse


def float_in(lo: float, hi: float | None = None, lo_open: bool = False):
    def parse(s: str) -> float:
        try:
            v = float(s)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
        bad = v != v or v < lo or (lo_open and v == lo) or (hi is not None and v > hi) or v in (float("inf"), float("-inf"))
        if bad:
            left = "(" if lo_open else "["
            rng = f"in {left}{lo}, {hi}]" if hi is not None else (f"> {lo}" if lo_open else f">= {lo}")
            raise argparse.ArgumentTypeError(f"expected a finite number {rng}, got {s!r}")
        return v

    parse.__name__ = "number"
    return parse


def int_list(lo: int, hi: int | None = None):
    one = int_at_least(lo, hi)

    def parse(s: str) -> list[int]:
        parts = [p.strip() for p in str(s).split(",")]
        if not parts or any(not p for p in parts):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {s!r}")
        try:
            return [one(p) for p in parts]
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e} (in {s!r})") from None

    parse.__name__ = "list of integers"
    return parse


def layer_set(s: str) -> list[int]:
    """'0-29', '3,7,12' or '0-4,20-29' → sorted layer indices (checked against the model later)."""
    out = set()
    for part in str(s).split(","):
        part = part.strip()
        try:
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                if a > b or a < 0:
                    raise ValueError
                out.update(range(a, b + 1))
            else:
                v = int(part)
                if v < 0:
                    raise ValueError
                out.add(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected layers like '0-29' or '3,7,12', got {s!r}") from None
    return sorted(out)


def choice_list(allowed, what: str, aliases: dict | None = None):
    aliases = aliases or {}

    def parse(s: str) -> list[str]:
        names = [p.strip() for p in str(s).split(",")]
        out = []
        for n in names:
            n = aliases.get(n, n)
            if n not in allowed:
                known = ", ".join(sorted(allowed)) + (f"; aliases: {', '.join(sorted(aliases))}" if aliases else "")
                raise argparse.ArgumentTypeError(f"unknown {what} {n!r} (known: {known})")
            if n not in out:
                out.append(n)
        return out

    parse.__name__ = f"list of {what}s"
    return parse


def scheme_list(s: str) -> list[str]:
    from .schemes import available_schemes

    return choice_list(available_schemes(), "scheme", SCHEME_ALIASES)(s)


def one_scheme(s: str) -> str:
    """One scheme name (or a --kv-cache-dtype alias), not a list."""
    names = scheme_list(s)
    if len(names) != 1:
        raise argparse.ArgumentTypeError(f"expected one scheme, got {s!r}")
    return names[0]


def sketch_bits(s: str) -> int:
    from contract.sketch import SKETCH_BITS

    try:
        b = int(s)
    except ValueError:
        b = None
    if b not in SKETCH_BITS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(map(str, SKETCH_BITS))}, got {s!r}")
    return b


def _can_create_in(folder: pathlib.Path) -> bool:
    """Whether a file can be created in ``folder`` (probed with a temporary file that is removed
    at once: permission bits do not tell for root, /proc or a read-only mount)."""
    if not folder.is_dir():
        return False
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError:
        return False
    return True


def _writable_target(p: pathlib.Path) -> bool:
    """Whether ``p`` could be created: its nearest existing ancestor is a folder we can write."""
    q = p
    while not q.exists():
        if q.parent == q:
            return False
        q = q.parent
    return _can_create_in(q)


def out_dir(s: str) -> pathlib.Path:
    p = pathlib.Path(s)
    if p.exists():
        if not p.is_dir():
            raise argparse.ArgumentTypeError(f"{s!r} exists and is not a folder")
        if not _can_create_in(p):
            raise argparse.ArgumentTypeError(f"folder {s!r} is not writable")
    elif not _writable_target(p):
        raise argparse.ArgumentTypeError(f"cannot create folder {s!r} (its parent is missing or not writable)")
    return p


def out_file(s: str) -> pathlib.Path:
    """A file to write: its folder must exist (a mistyped path never creates folders)."""
    p = pathlib.Path(s)
    if p.exists():
        if p.is_dir():
            raise argparse.ArgumentTypeError(f"{s!r} is a folder, expected a file")
        if not os.access(p, os.W_OK):
            raise argparse.ArgumentTypeError(f"file {s!r} is not writable")
    elif not p.parent.is_dir():
        raise argparse.ArgumentTypeError(f"cannot create file {s!r}: no such folder {str(p.parent)!r}")
    elif not _can_create_in(p.parent):
        raise argparse.ArgumentTypeError(f"cannot create file {s!r}: folder {str(p.parent)!r} is not writable")
    return p


def in_file(s: str) -> pathlib.Path:
    p = pathlib.Path(s)
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{s!r} is a folder, expected a file")
    if not p.is_file():
        raise argparse.ArgumentTypeError(f"no such file {s!r}")
    return p


def model_dir(s: str) -> pathlib.Path:
    p = pathlib.Path(s)
    if not (p / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"{s!r} is not a local Hugging Face model folder (no config.json)")
    import json

    from .model import check_supported_config

    try:
        check_supported_config(json.loads((p / "config.json").read_text()))
    except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
        raise argparse.ArgumentTypeError(f"{s!r}: unreadable config.json ({e})") from None
    except NotImplementedError as e:
        raise argparse.ArgumentTypeError(f"{s!r}: {e}") from None
    return p


def predicate(s: str) -> str:
    from .predicate import PredicateError, compile_predicate

    try:
        compile_predicate(s)
    except PredicateError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return s


def device(s: str) -> str:
    if s not in ("auto", "cpu", "cuda") and not s.startswith("cuda:"):
        raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N, got {s!r}")
    if s != "cpu":
        import torch

        if s != "auto" and not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{s!r}: no CUDA device is available (torch {torch.__version__})")
        if s == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
    return s


#: --dtype values ("auto": float32 on the CPU, bfloat16 on CUDA)
DTYPES = ("auto", "float32", "float16", "bfloat16", "fp32", "fp16", "bf16")


def dtype_name(s: str) -> str:
    canon = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}.get(s, s)
    if canon not in DTYPES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(DTYPES)}, got {s!r}")
    return canon

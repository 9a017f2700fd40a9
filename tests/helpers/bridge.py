"""Helpers of the proofs bridge's tests: the names of failed checks, and a writable copy of lean/ to edit."""

from __future__ import annotations

import shutil


def failed(results):
    """The names of the checks in ``results`` that failed (``ok is False``: a SKIP is not a failure)."""
    return [name for name, ok, _ in results if ok is False]


def lean_copy(tmp_path):
    """A copy of the repository's lean/ under ``tmp_path``."""
    from proofs_bridge import check as C

    dst = tmp_path / "lean"
    shutil.copytree(C.ROOT / "lean", dst)
    return dst


def edit(lean, name, old, new):
    """Replace the first ``old`` (which must be there) by ``new`` in ``lean/WitCert/<name>.lean``."""
    f = lean / "WitCert" / f"{name}.lean"
    text = f.read_text()
    assert old in text
    f.write_text(text.replace(old, new, 1))


def failed_lean(lean):
    """The Lean checks (``check_lean``) that fail on the sources under ``lean``."""
    from proofs_bridge import check as C

    return [name for name, ok, _ in C.check_lean(lean) if ok is False]


def assert_each_edit_fails(tmp_path, cases):
    """For each ``(file, old, new, name)``: on a fresh copy of lean/ with ``old`` replaced by ``new`` in
    ``lean/WitCert/<file>.lean``, exactly the Lean check ``name`` fails."""
    for k, (file, old, new, name) in enumerate(cases):
        lean = lean_copy(tmp_path / str(k))
        edit(lean, file, old, new)
        assert failed_lean(lean) == [name], (file, old)

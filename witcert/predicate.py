"""Predicates over trace rows, in the DTrace spirit: ``layer>=20 and tv>0.1``.

A small recursive-descent parser (never ``eval``) into an AST that is evaluated on numpy
columns (a whole trace, or one StepRecord's rows at record time). Grammar:

    expr    := or
    or      := and  (("or" | "||") and)*
    and     := not  (("and" | "&&") not)*
    not     := ("not" | "!") not  |  atom
    atom    := "(" expr ")"  |  value [cmp value]      (a bare value must be a bool field)
    cmp     := "==" | "=" | "!=" | "<" | "<=" | ">" | ">="
    value   := FIELD | NUMBER | 'string' | "string" | true | false | null

FIELD is a trace schema field (``witcert.trace.FIELDS``). Comparisons are type-checked (a
string field only with ``==`` / ``!=`` against a string or null; numeric fields against numbers
or numeric fields). Null / NaN compares false except ``== null`` / ``!= null``. Anything else
(calls, attributes, subscripts, unknown names, escapes, more than ``MAX_LENGTH`` characters or
``MAX_DEPTH`` nesting) is rejected with ``PredicateError`` naming the position.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from .trace_schema import FIELDS

MAX_LENGTH = 1000
MAX_DEPTH = 32

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?)
  | (?P<str>'[^'\\\n]*'|"[^"\\\n]*")
  | (?P<op>==|!=|<=|>=|&&|\|\||[<>=!()])
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
""", re.VERBOSE)
_CMP = {"==", "=", "!=", "<", "<=", ">", ">="}
_KEYWORDS = {"and", "or", "not", "true", "false", "null"}


class PredicateError(ValueError):
    """An expression the predicate language does not accept."""


@dataclasses.dataclass(frozen=True)
class Tok:
    kind: str  # num | str | op | name | end
    text: str
    pos: int


def tokenize(src: str) -> list[Tok]:
    if not isinstance(src, str):
        raise PredicateError(f"predicate: expected a string, got {type(src).__name__}")
    if len(src) > MAX_LENGTH:
        raise PredicateError(f"predicate: longer than {MAX_LENGTH} characters")
    out, i = [], 0
    while i < len(src):
        m = _TOKEN.match(src, i)
        if not m:
            raise PredicateError(f"predicate: unexpected character {src[i]!r} at position {i}")
        if m.lastgroup != "ws":
            out.append(Tok(m.lastgroup, m.group(), i))
        i = m.end()
    out.append(Tok("end", "", len(src)))
    return out


# --------------------------------------------------------------------------- AST
@dataclasses.dataclass(frozen=True)
class FieldRef:
    name: str


@dataclasses.dataclass(frozen=True)
class Literal:
    value: object  # float | str | bool | None


@dataclasses.dataclass(frozen=True)
class Compare:
    op: str
    left: object
    right: object


@dataclasses.dataclass(frozen=True)
class BoolOp:
    op: str  # and | or
    items: tuple


@dataclasses.dataclass(frozen=True)
class Not:
    item: object


@dataclasses.dataclass(frozen=True)
class Truthy:
    field: FieldRef


@dataclasses.dataclass(frozen=True)
class Predicate:
    """A parsed predicate: ``evaluate(columns) -> bool array``."""

    source: str
    tree: object

    def evaluate(self, columns: dict) -> np.ndarray:
        n = len(columns["tv"]) if "tv" in columns else len(next(iter(columns.values())))
        return np.asarray(_eval(self.tree, columns, n), dtype=bool)


class _Parser:
    def __init__(self, src: str, fields: dict):
        self.src, self.toks, self.i, self.fields, self.depth = src, tokenize(src), 0, fields, 0

    def peek(self) -> Tok:
        return self.toks[self.i]

    def take(self) -> Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def fail(self, t: Tok, what: str):
        shown = t.text or "end of input"
        raise PredicateError(f"predicate: {what} at position {t.pos} ({shown!r}) in {self.src!r}")

    def word(self, t: Tok, *words) -> bool:
        return (t.kind == "name" and t.text.lower() in words) or (t.kind == "op" and t.text in words)

    def parse(self):
        if self.peek().kind == "end":
            raise PredicateError("predicate: empty expression")
        tree = self.or_()
        if self.peek().kind != "end":
            self.fail(self.peek(), "unexpected token")
        return tree

    def _nest(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise PredicateError(f"predicate: nested deeper than {MAX_DEPTH}")

    def or_(self):
        items = [self.and_()]
        while self.word(self.peek(), "or", "||"):
            self.take()
            items.append(self.and_())
        return items[0] if len(items) == 1 else BoolOp("or", tuple(items))

    def and_(self):
        items = [self.not_()]
        while self.word(self.peek(), "and", "&&"):
            self.take()
            items.append(self.not_())
        return items[0] if len(items) == 1 else BoolOp("and", tuple(items))

    def not_(self):
        if self.word(self.peek(), "not", "!"):
            self.take()
            self._nest()
            item = self.not_()
            self.depth -= 1
            return Not(item)
        return self.atom()

    def atom(self):
        t = self.peek()
        if t.kind == "op" and t.text == "(":
            self.take()
            self._nest()
            e = self.or_()
            self.depth -= 1
            if not (self.peek().kind == "op" and self.peek().text == ")"):
                self.fail(self.peek(), "expected ')'")
            self.take()
            return e
        left = self.value()
        t = self.peek()
        if t.kind == "op" and t.text in _CMP:
            self.take()
            right = self.value()
            return self.check(Compare("==" if t.text == "=" else t.text, left, right), t)
        if isinstance(left, FieldRef) and self.fields[left.name] == "bool":
            return Truthy(left)
        self.fail(t, "expected a comparison (a bare value must be a bool field)")

    def value(self):
        t = self.take()
        if t.kind == "num":
            return Literal(float(t.text))
        if t.kind == "str":
            return Literal(t.text[1:-1])
        if t.kind == "name":
            w = t.text.lower()
            if w in ("true", "false"):
                return Literal(w == "true")
            if w == "null":
                return Literal(None)
            if w in _KEYWORDS:
                self.fail(t, "expected a field or a value")
            if t.text not in self.fields:
                nxt = self.peek()
                if nxt.kind == "op" and nxt.text == "(":
                    self.fail(t, "function calls are not part of the predicate language")
                self.fail(t, f"unknown field (fields: {', '.join(self.fields)})")
            return FieldRef(t.text)
        self.fail(t, "expected a field or a value")

    def kind(self, v) -> str:
        if isinstance(v, FieldRef):
            k = self.fields[v.name]
            return "num" if k in ("int", "float", "bool") else "str"
        if v.value is None:
            return "null"
        if isinstance(v.value, str):
            return "str"
        return "num"

    def check(self, c: Compare, t: Tok) -> Compare:
        kl, kr = self.kind(c.left), self.kind(c.right)
        if not isinstance(c.left, FieldRef) and not isinstance(c.right, FieldRef):
            self.fail(t, "a comparison needs a field on one side")
        if "null" in (kl, kr):
            if c.op not in ("==", "!="):
                self.fail(t, "null compares only with == or !=")
        elif kl != kr:
            self.fail(t, f"cannot compare {kl} with {kr}")
        elif kl == "str" and c.op not in ("==", "!="):
            self.fail(t, "strings compare only with == or !=")
        return c


def compile_predicate(src: str, fields: dict | None = None) -> Predicate:
    """Parse ``src`` against the trace schema (``fields``: name → kind, default the schema)."""
    if fields is None:
        fields = {f.name: f.kind for f in FIELDS}
    return Predicate(src, _Parser(src, fields).parse())


def _column(v, cols, n):
    if isinstance(v, FieldRef):
        return cols[v.name]
    return v.value


def _is_null(x, n):
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            return np.array([e is None for e in x], dtype=bool)
        if x.dtype.kind == "f":
            return np.isnan(x)
        return np.zeros(len(x), dtype=bool)
    return np.full(n, x is None)


def _eval(node, cols, n):
    if isinstance(node, BoolOp):
        out = _eval(node.items[0], cols, n)
        for it in node.items[1:]:
            out = (out & _eval(it, cols, n)) if node.op == "and" else (out | _eval(it, cols, n))
        return out
    if isinstance(node, Not):
        return ~_eval(node.item, cols, n)
    if isinstance(node, Truthy):
        return np.asarray(cols[node.field.name], dtype=bool)
    if isinstance(node, Compare):
        a, b = _column(node.left, cols, n), _column(node.right, cols, n)
        if (isinstance(node.left, Literal) and node.left.value is None) or (isinstance(node.right, Literal) and node.right.value is None):
            col = a if isinstance(node.left, FieldRef) else b
            null = _is_null(col, n)
            return null if node.op == "==" else ~null
        if any(isinstance(x, np.ndarray) and x.dtype == object for x in (a, b)):
            aa = a if isinstance(a, np.ndarray) else np.full(n, a, dtype=object)
            bb = b if isinstance(b, np.ndarray) else np.full(n, b, dtype=object)
            eq = np.array([x == y for x, y in zip(aa, bb)], dtype=bool)
            return eq if node.op == "==" else ~eq & ~_is_null(aa, n) & ~_is_null(bb, n)
        a = np.asarray(a, dtype=float)
        b = np.asarray(b, dtype=float)
        with np.errstate(invalid="ignore"):
            r = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal,
                 ">": np.greater, ">=": np.greater_equal}[node.op](a, b)
        if node.op == "!=":  # NaN (null) != x is false, like every other comparison with null
            r = r & ~np.isnan(a) & ~np.isnan(b)
        return np.broadcast_to(r, (n,))
    raise PredicateError(f"predicate: cannot evaluate {node!r}")

"""A small parser for the restricted Lean expression grammar of the §9 statements.

It reads a theorem's binders and conclusion (or a ``def``'s body) from the Lean source and
turns expressions into sympy. It does not elaborate Lean: it reads the surface syntax below
and **raises ``LeanParseError`` on anything else** rather than guessing.

Grammar (precedences as in Lean 4 / Mathlib)::

    conj   := rel ('∧' rel)*                       -> list of relations
    rel    := '∀' ident+ ',' conj                  -> ('∀', names, relations)
            | '∃' ident+ ',' conj                  -> ('∃', names, relations)
            | sum (('≤' | '<' | '=' | '≥') sum)?   -> (op, lhs, rhs) or an expression
    sum    := term (('+' | '-' | '∪') term)*
    term   := unary (('*' | '/' | '•') unary)*
    unary  := '-' unary | power
    power  := app ('^' unary)?
    app    := atom atom*            (application: an identifier applied to atoms)
    atom   := number | ident | '(' conj [':' type] ')' | '|' sum '|' | '‖' sum '‖'
            | '∑' ident ['∈' sum] ',' term     (the body binds like Lean's `∑`: a term)
            | '⋃' ident ['∈' sum] ',' term     (indexed union, read like `∑`)
            | '{' ident '|' conj '}'

Translation: ``Real.exp/log/sqrt/tanh/sinh`` and ``max`` map to sympy functions, ``Real.pi``
to ``pi``, ``|x|`` to ``Abs``, ``‖x‖`` to ``norm(x)``; ``∑ j ∈ S, b`` to ``Sum(S, Lambda(j, b))``
(``∑ j, b`` sums over ``univ``); ``⋃ j ∈ S, E`` to ``iUnion(S, Lambda(j, E))``; ``∃ j, P``
inside a set-builder to ``exists(j, P)``; ``{x | P}`` to ``setOf(Lambda(x, P))``; ``∪`` to ``union``;
``•`` to ``*``; a type ascription ``(e : T)`` to ``e``; any other application ``f a b`` to
the undefined function ``f(a, b)``, and identifiers to plain symbols (no assumptions).
"""

from __future__ import annotations

import re

import sympy as sp


class LeanParseError(ValueError):
    pass


_SUB = "₀₁₂₃₄₅₆₇₈₉"
_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d+)?)|(?P<id>[^\W\d][\w'." + _SUB + r"]*)|(?P<op>[≤≥<=∧∈∪+\-*/^(),|‖∑⋃{}•:∀∃]))",
    re.UNICODE,
)
FUNCS = {"Real.exp": sp.exp, "Real.log": sp.log, "Real.sqrt": sp.sqrt, "Real.tanh": sp.tanh,
         "Real.sinh": sp.sinh, "max": sp.Max}
CONSTS = {"Real.pi": sp.pi}
_REL = {"≤": sp.Le, "<": sp.Lt, "=": sp.Eq, "≥": sp.Ge}
Sum = sp.Function("Sum")
setOf = sp.Function("setOf")
norm = sp.Function("norm")
union = sp.Function("union")
iUnion = sp.Function("iUnion")
exists_ = sp.Function("exists")
forall_ = sp.Function("forall")
UNIV = sp.Symbol("univ")


def tokenize(text: str) -> list[str]:
    text = text.replace("Finset.univ", "univ")
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise LeanParseError(f"cannot read {text[pos:pos + 30]!r}")
        tok = m.group("num") or m.group("id") or m.group("op")
        out.append(tok)
        pos = m.end()
    return out


class _Parser:
    def __init__(self, tokens: list[str]):
        self.t = tokens
        self.i = 0

    def peek(self, k: int = 0):
        return self.t[self.i + k] if self.i + k < len(self.t) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise LeanParseError(f"expected {want!r}, found {tok!r} at token {self.i}")
        self.i += 1
        return tok

    def conj(self):
        rels = [self.rel()]
        while self.peek() == "∧":
            self.take()
            rels.append(self.rel())
        return rels

    def rel(self):
        if self.peek() in ("∀", "∃"):
            q = self.take()
            names = []
            while self.peek() != ",":
                names.append(self.take())
            self.take(",")
            return (q, tuple(names), self.conj())
        lhs = self.sum()
        if self.peek() in _REL:
            op = self.take()
            return (op, lhs, self.sum())
        return lhs

    def sum(self):
        e = self.term()
        while self.peek() in ("+", "-", "∪"):
            op = self.take()
            r = self.term()
            e = e + r if op == "+" else e - r if op == "-" else union(e, r)
        return e

    def term(self):
        e = self.unary()
        while self.peek() in ("*", "/", "•"):
            op = self.take()
            r = self.unary()
            e = e / r if op == "/" else e * r
        return e

    def unary(self):
        if self.peek() == "-":
            self.take()
            return -self.unary()
        return self.power()

    def power(self):
        base = self.app()
        if self.peek() == "^":
            self.take()
            return base ** self.unary()
        return base

    def _atom_start(self):
        tok = self.peek()
        if tok is None:
            return False
        return tok in ("(", "∑", "⋃", "{") or tok[0].isdigit() or (tok[0].isalpha() or tok[0] == "_") and tok not in ("∈",)

    def app(self):
        tok = self.peek()
        head_is_name = tok is not None and (tok[0].isalpha() or tok[0] == "_")
        head = self.atom()
        if not head_is_name:
            return head
        args = []
        while self._atom_start():
            args.append(self.atom())
        if not args:
            return head
        name = tok
        if name in FUNCS:
            return FUNCS[name](*args)
        if name in CONSTS:
            raise LeanParseError(f"{name} applied to arguments")
        return sp.Function(name)(*args)

    def atom(self):
        tok = self.take()
        if tok[0].isdigit():
            return sp.Rational(tok) if "." in tok else sp.Integer(int(tok))
        if tok == "(":
            e = self.conj()
            if self.peek() == ":":  # type ascription: keep the value
                self.take()
                depth = 0
                while not (self.peek() == ")" and depth == 0):
                    t = self.take()
                    depth += t == "("
                    depth -= t == ")"
            self.take(")")
            if len(e) != 1:
                raise LeanParseError("a conjunction inside parentheses")
            return e[0]
        if tok == "|":
            e = self.sum()
            self.take("|")
            return sp.Abs(e)
        if tok == "‖":
            e = self.sum()
            self.take("‖")
            return norm(e)
        if tok in ("∑", "⋃"):
            var = sp.Symbol(self.take())
            dom = UNIV
            if self.peek() == "∈":
                self.take()
                dom = self.sum()
            self.take(",")
            body = self.term()
            return (Sum if tok == "∑" else iUnion)(dom, sp.Lambda(var, body))
        if tok == "{":
            var = sp.Symbol(self.take())
            self.take("|")
            cond = self.conj()
            self.take("}")
            if len(cond) != 1:
                raise LeanParseError("a conjunction inside a set-builder")
            return setOf(sp.Lambda(var, _as_sympy(cond[0])))
        if tok[0].isalpha() or tok[0] == "_":
            if tok in CONSTS:
                return CONSTS[tok]
            if tok in FUNCS:
                return sp.Function("__" + tok)  # a bare function name: only legal when applied
            return sp.Symbol(tok)
        raise LeanParseError(f"unexpected {tok!r}")


def _as_sympy(rel):
    if isinstance(rel, tuple) and rel[0] in ("∀", "∃"):
        q, names, rels = rel
        body = [_as_sympy(r) for r in rels]
        if len(body) != 1:
            raise LeanParseError("a conjunction under a quantifier inside a set-builder")
        return (forall_ if q == "∀" else exists_)(*[sp.Symbol(n) for n in names], body[0])
    if isinstance(rel, tuple):
        op, a, b = rel
        return _REL[op](a, b, evaluate=False)
    return rel


def parse_expr(text: str):
    """Parse a conjunction of relations (or one expression); returns a list of (op, lhs, rhs)
    tuples or expressions. Raises LeanParseError unless every token is consumed."""
    p = _Parser(tokenize(text))
    out = p.conj()
    if p.peek() is not None:
        raise LeanParseError(f"unparsed tail starting at {p.peek()!r}")
    return out


def _split_top(text: str, sep: str) -> int:
    """Index of the first ``sep`` outside brackets (or -1)."""
    depth = 0
    for k, ch in enumerate(text):
        if ch in "([{⟨":
            depth += 1
        elif ch in ")]}⟩":
            depth -= 1
        elif depth == 0 and text.startswith(sep, k):
            return k
    return -1


def theorem(source: str, name: str) -> dict:
    """``{"binders": {name: type_text}, "conclusion": text}`` of ``theorem name`` in ``source``."""
    m = re.search(rf"^(?:theorem|lemma)\s+{re.escape(name)}\b", source, re.MULTILINE)
    if not m:
        raise LeanParseError(f"theorem {name} not found")
    rest = source[m.end():]
    end = _split_top(rest, ":=")
    if end < 0:
        raise LeanParseError(f"theorem {name}: no ':='")
    head = rest[:end]
    binders, k = {}, 0
    while True:
        while k < len(head) and head[k].isspace():
            k += 1
        if k < len(head) and head[k] in "({[":
            close = {"(": ")", "{": "}", "[": "]"}[head[k]]
            depth, j = 0, k
            while True:
                if head[j] in "({[":
                    depth += 1
                elif head[j] in ")}]":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            inner = head[k + 1 : j]
            if head[k] == "(" and close == ")":
                c = _split_top(inner, ":")
                if c > 0:
                    for nm in inner[:c].split():
                        binders[nm] = " ".join(inner[c + 1 :].split())
            k = j + 1
            continue
        break
    if k >= len(head) or head[k] != ":":
        raise LeanParseError(f"theorem {name}: expected ':' before the conclusion")
    return {"binders": binders, "conclusion": " ".join(head[k + 1 :].split())}


def definition(source: str, name: str) -> tuple[list[str], str]:
    """(parameter names, body text) of ``def name (a b : T) … : T := body``."""
    m = re.search(rf"^(?:noncomputable\s+)?def\s+{re.escape(name)}\b(.*?):=\s*(.*?)"
                  r"(?=\n\s*\n|\n(?:/--|theorem|lemma|def|noncomputable|end)\b)",
                  source, re.MULTILINE | re.DOTALL)
    if not m:
        raise LeanParseError(f"def {name} not found")
    head, body = m.group(1), " ".join(m.group(2).split())
    params = []
    for grp in re.findall(r"\(([^():]*):", head):
        params += grp.split()
    return params, body


def normalize(e):
    """Assumption-free symbols, expanded bodies of summations: a canonical form to compare."""
    e = sp.sympify(e)
    e = e.xreplace({s: sp.Symbol(s.name) for s in e.atoms(sp.Symbol)})  # bound variables too
    e = e.replace(lambda x: isinstance(x, sp.Lambda),
                  lambda x: sp.Lambda(x.variables, sp.expand(x.expr) if x.expr.is_Relational is not True else x.expr))
    return e


def same_expr(a, b) -> bool:
    a, b = normalize(a), normalize(b)
    if a == b:
        return True
    try:
        return sp.simplify(sp.expand(a - b)) == 0
    except (TypeError, AttributeError):
        return False


def same_rel(got, want) -> bool:
    """Compare parsed relation(s) with the expected (op, lhs, rhs) tuple(s), side by side."""
    got = got if isinstance(got, list) else [got]
    want = want if isinstance(want, list) else [want]
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if isinstance(w, tuple) != isinstance(g, tuple):
            return False
        if isinstance(w, tuple) and w[0] in ("∀", "∃"):
            if g[0] != w[0] or g[1] != w[1] or not same_rel(g[2], w[2]):
                return False
        elif isinstance(w, tuple):
            if g[0] != w[0] or not same_expr(g[1], w[1]) or not same_expr(g[2], w[2]):
                return False
        elif not same_expr(g, w):
            return False
    return True

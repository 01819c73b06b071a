"""A tiny evaluator for the LaTeX that most math answers are: numbers, \\frac, \\sqrt, \\pi, powers,
+ - * /, implicit products and one variable; plus intervals with numeric ends.

It exists to say "these two answers are different" without sympy: if two expressions take clearly
different values at a point, no grader can call them equal. Anything outside this small grammar, or
anything the graders normalise in ways a plain reading would miss (digit groups like `1 000`, mixed
numbers like `7 3/4`, text, units, `=`, commas, `e`, `i`), is refused (None) and goes to the graders.
"""

from __future__ import annotations

import cmath
import re
from collections.abc import Callable

Expr = Callable[[complex], complex]

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d+)?)|(?P<cmd>\\[a-zA-Z]+)|(?P<var>[a-z])|(?P<op>[-+*/^(){}\[\]]))"
)
_REFUSE = re.compile(r"\d\s+\d|\d\s*\\[,!;: ]|[=,%$]|\\text|\\mathrm|\\left\.|\\right\.")
_VARIABLES = set("abcdfghjklmnopqrstuvwxyz")  # not e, i: the graders may read them as constants
_SKIP = {"\\left", "\\right", "\\displaystyle"}
_FRAC = {"\\frac", "\\dfrac", "\\tfrac"}
_TIMES = {"\\cdot", "\\times"}
MAX_EXPONENT = 64


class _Refuse(Exception):
    pass


def _tokens(s: str) -> list[str]:
    out, pos = [], 0
    s = s.strip()
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if m is None or m.end() == pos:
            raise _Refuse
        tok = m.group(m.lastgroup or "")
        pos = m.end()
        if tok in _SKIP:
            continue
        out.append(tok)
    return out


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.t = tokens
        self.i = 0
        self.variables: set[str] = set()

    def peek(self) -> str | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise _Refuse
        self.i += 1
        return tok

    def expr(self) -> Expr:
        left = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            right = self.term()
            left = (
                (lambda a, b: lambda x: a(x) + b(x))(left, right)
                if op == "+"
                else (lambda a, b: lambda x: a(x) - b(x))(left, right)
            )
        return left

    def _starts_factor(self, tok: str | None) -> bool:
        return tok is not None and (
            tok in ("(", "{") or tok[0].isdigit() or tok in _VARIABLES or tok in ("\\pi", "\\sqrt", *_FRAC)
        )

    def term(self) -> Expr:
        left = self.unary()
        while True:
            tok = self.peek()
            if tok in ("*", "/") or tok in _TIMES:
                self.take()
                right = self.unary()
                if tok == "/":
                    left = (lambda a, b: lambda x: a(x) / b(x))(left, right)
                else:
                    left = (lambda a, b: lambda x: a(x) * b(x))(left, right)
            elif self._starts_factor(tok):
                right = self.power()
                left = (lambda a, b: lambda x: a(x) * b(x))(left, right)
            else:
                return left

    def unary(self) -> Expr:
        if self.peek() == "-":
            self.take()
            inner = self.unary()
            return lambda x: -inner(x)
        if self.peek() == "+":
            self.take()
            return self.unary()
        return self.power()

    def power(self) -> Expr:
        base = self.atom()
        if self.peek() == "^":
            self.take()
            if self.peek() == "{":
                exponent = self.group()
            else:
                tok = self.take()
                if not (tok.isdigit() and len(tok) == 1) and tok not in _VARIABLES:
                    raise _Refuse  # x^23 means x^2 * 3 in LaTeX: leave such input to the graders
                exponent = self._leaf(tok)

            def pw(x: complex, b: Expr = base, e: Expr = exponent) -> complex:
                ev = e(x)
                if abs(ev) > MAX_EXPONENT:
                    raise _Refuse
                return b(x) ** ev

            return pw
        return base

    def group(self) -> Expr:
        self.take("{")
        inner = self.expr()
        self.take("}")
        return inner

    def _leaf(self, tok: str) -> Expr:
        if tok[0].isdigit():
            v = complex(float(tok))
            return lambda x: v
        if tok in _VARIABLES:
            self.variables.add(tok)
            return lambda x: x
        raise _Refuse

    def atom(self) -> Expr:
        tok = self.take()
        if tok == "(":
            inner = self.expr()
            self.take(")")
            return inner
        if tok == "{":
            inner = self.expr()
            self.take("}")
            return inner
        if tok == "\\pi":
            return lambda x: complex(cmath.pi)
        if tok in _FRAC:
            num, den = self._arg(), self._arg()
            return lambda x: num(x) / den(x)
        if tok == "\\sqrt":
            if self.peek() == "[":
                raise _Refuse
            arg = self._arg()
            return lambda x: cmath.sqrt(arg(x))
        return self._leaf(tok)

    def _arg(self) -> Expr:
        """A command argument: {expr} or one digit (\\frac12) or one letter."""
        if self.peek() == "{":
            return self.group()
        tok = self.take()
        if tok[0].isdigit():
            if len(tok) > 1:  # \frac123 is \frac{1}{2}3: refuse rather than guess
                raise _Refuse
            return self._leaf(tok)
        return self._leaf(tok)


def parse(latex: str) -> tuple[Expr, frozenset[str]] | None:
    """A function of the (at most one) variable and the variables used, or None when refused."""
    if _REFUSE.search(latex):
        return None
    try:
        p = _Parser(_tokens(latex))
        f = p.expr()
        if p.peek() is not None or len(p.variables) > 1:
            return None
        return f, frozenset(p.variables)
    except (_Refuse, RecursionError):
        return None


_INTERVAL = re.compile(r"\s*(?:\\left)?\s*([\[(])(.+),(.+?)(?:\\right)?\s*([\])])\s*")
POINTS = (0.5377, 1.8339, -2.2588)  # arbitrary, irrational-looking: a wrong answer rarely agrees at all three


def _value(f: Expr, x: complex) -> complex | None:
    try:
        v = f(x)
    except (_Refuse, ZeroDivisionError, OverflowError, ValueError):
        return None
    return v if cmath.isfinite(v) else None


def clearly_different(answer: str, truth: str, rel: float = 1e-4, floor: float = 1e-5) -> bool:
    """True only when the two are certainly not equal: values apart at some point by more than `rel`
    (relative) and `floor` (absolute; math-verify rounds to 6 decimals), or intervals whose bracket
    types differ or whose ends clearly differ. False means "cannot tell": ask the graders."""
    ia, ig = _INTERVAL.fullmatch(answer), _INTERVAL.fullmatch(truth)
    if ia and ig:
        if "," in ia.group(2) or "," in ig.group(2):
            return False
        if (ia.group(1), ia.group(4)) != (ig.group(1), ig.group(4)):
            return all(parse(e) is not None for e in (ia.group(2), ia.group(3), ig.group(2), ig.group(3)))
        return any(
            clearly_different(a, b, rel, floor)
            for a, b in ((ia.group(2), ig.group(2)), (ia.group(3), ig.group(3)))
        )
    pa, pg = parse(answer), parse(truth)
    if pa is None or pg is None or pa[1] != pg[1]:
        return False
    points = POINTS if pa[1] else (0.0,)
    for x in points:
        va, vg = _value(pa[0], complex(x)), _value(pg[0], complex(x))
        if va is None or vg is None:
            return False
        d = abs(va - vg)
        if d > floor and d > rel * max(abs(va), abs(vg)):
            return True
    return False

"""Kruise's resource expression language (resourcesPolicy.resourcesExpr), parsed and evaluated.

A SidecarSet written for Kruise must compute the same resources here, and fail with the same
message, so this follows Kruise's calculator rather than a cleaner design:

* grammar: `+ -` below `* /`, both left-associative; unary minus binds to one factor
  (`-2*3` is `(-2)*3`, `10--5` is 15); `name(a)` and `name(a, b)` calls; no unary plus;
* tokens: a number is digits with at most one `.`, an optional exponent and `%`, then any letters;
  it is a Quantity only when those letters are exactly one of `m k M G T P Ki Mi Gi Ti Pi`, else a
  float that silently reads as 0 when it does not parse (`1gi` is 0); the input is scanned byte by
  byte, each byte taken as a Latin-1 character, and a NUL byte ends it;
* values are float64 numbers or Quantities (sidecarsets.values.quantity); a number meeting a Quantity
  becomes milli-units, truncated; Quantity * number keeps the Quantity's format;
* errors: evaluation goes on after a semantic error, the *last* one wins and beats a later syntax
  error; a syntax error reads `parse error: syntax error at line L, col C`; a negative final
  result is an error.

The parser is recursive descent. It reduces exactly what Kruise's LALR(1) parser (goyacc, with
default reductions) has reduced when it meets the same bad token, so the same semantic errors
are raised before a syntax error. Nesting is bounded (Kruise's is not) so that a crafted
expression cannot exhaust the stack.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sidecarsets.values import quantity
from sidecarsets.values.gofmt import float_to_int64, format_g
from sidecarsets.values.quantity import Quantity, QuantityError

MAX_DEPTH = 100  # parentheses and calls inside one another
_SPACE = frozenset("\t\n\v\f\r \x85\xa0")  # Go's unicode.IsSpace over Latin-1
_DIGITS = frozenset("0123456789")
_NUMERIC = frozenset("0123456789.eE+-")
_UNITS = frozenset({"m", "k", "M", "G", "T", "P", "Ki", "Mi", "Gi", "Ti", "Pi"})
_OPERATORS = frozenset("+-*/(),")


class CalcError(ValueError):
    """The expression cannot be evaluated; the message is Kruise's."""


@dataclass(frozen=True, slots=True)
class Value:
    """A number (float64) or, when `quantity` is set, a Quantity."""

    number: float = 0.0
    quantity: Quantity | None = None

    def __str__(self) -> str:
        return str(self.quantity) if self.quantity is not None else format_g(self.number)

    def as_quantity(self) -> Quantity:
        """A number becomes milli-units (truncated), DecimalSI."""
        if self.quantity is not None:
            return self.quantity
        return quantity.new_milli_quantity(float_to_int64(self.number * 1000), quantity.DECIMAL_SI)


def number(value: float) -> Value:
    return Value(number=value)


def of(q: Quantity) -> Value:
    return Value(quantity=q)


def evaluate(expression: str, variables: Mapping[str, Value]) -> Value:
    """The value of `expression`; `variables` are keyed by lower-case name. Raises CalcError."""
    return _Parser(expression, variables).run()


class _SyntaxError(Exception):
    pass


class _Lexer:
    """Kruise's lexer, character for character (line and column as it counts them)."""

    def __init__(self, text: str) -> None:
        self.text = text.encode("utf-8").decode("latin-1")
        self.pos = 0
        self.line = 1
        self.col = 1

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else "\0"

    def next(self) -> str:
        if self.pos >= len(self.text):
            return "\0"
        ch = self.text[self.pos]
        self.pos += 1
        if ch == "\n":
            self.line += 1
            self.col = 1
        else:
            self.col += 1
        return ch

    def token(self) -> tuple[str, str]:
        """(kind, text): kind is num, qty, ident, op, eof or char (anything else)."""
        while self.peek() != "\0" and self.peek() in _SPACE:
            self.next()
        ch = self.next()
        if ch == "\0":
            return "eof", ""
        if ch in _OPERATORS:
            return "op", ch
        if ch == "." or ch in _DIGITS:
            self.pos -= 1
            self.col -= 1
            text = self._number()
            return ("qty" if _is_quantity(text) else "num"), text
        if ch.isalpha():
            self.pos -= 1
            self.col -= 1
            start = self.pos
            while (c := self.peek()) != "\0" and (c.isalpha() or c in _DIGITS or c == "_"):
                self.next()
            return "ident", self.text[start : self.pos]
        return "char", ch

    def _number(self) -> str:
        """A number token: the numeral (`_Numeral`), then the letters of its unit, if any (`Gi`)."""
        start = self.pos
        numeral = _Numeral()
        while numeral.takes(self.peek()):
            self.next()
        if numeral.unit_follows(self.peek()):
            while self.peek().isalpha():
                self.next()
        return self.text[start : self.pos]


class _Numeral:
    """What the numeral scanned so far holds, which decides whether the next character continues
    it: digits, at most one `.` (not after the exponent or `%`), at most one exponent `e`/`E` (a
    sign may follow it), at most one `%`."""

    __slots__ = ("dot", "exponent", "percent", "sign_next")

    def __init__(self) -> None:
        self.dot = self.exponent = self.percent = self.sign_next = False

    def takes(self, ch: str) -> bool:
        """Whether `ch` continues the numeral (and if so, note it)."""
        if ch in _DIGITS:
            self.sign_next = False
        elif ch == ".":
            if self.dot or self.exponent or self.percent:
                return False
            self.dot = True
        elif ch in "eE":
            if self.exponent or self.percent:
                return False
            self.exponent = self.sign_next = True
        elif ch in "+-":
            if not self.sign_next:
                return False
            self.sign_next = False
        elif ch == "%":
            if self.percent:
                return False
            self.percent = True
        else:
            return False
        return True

    def unit_follows(self, ch: str) -> bool:
        """Letters after the numeral are its unit, read whole; not where the exponent's sign or
        digits were due (`1ex` reads `1e`), nor an `e` the numeral refused (`1e5e`)."""
        return ch.isalpha() and ch not in "eE" and not self.sign_next


def _is_quantity(text: str) -> bool:
    end = next((i for i, c in enumerate(text) if c not in _NUMERIC), 0)
    return end > 0 and text[end:] in _UNITS


def _parse_number(text: str) -> float:
    """strconv.ParseFloat as Kruise uses it: a trailing % divides by 100; what does not parse is 0."""
    if text.endswith("%"):
        try:
            value = float(text[:-1])
        except ValueError:
            return 0.0
        return 0.0 if value in (float("inf"), float("-inf")) else value / 100  # ParseFloat's ErrRange
    try:
        return float(text)
    except ValueError:
        return 0.0


def _display(ident: str) -> str:
    """An identifier's bytes as Go prints them (invalid UTF-8 replaced)."""
    return ident.encode("latin-1").decode("utf-8", "replace")


class _Parser:
    def __init__(self, text: str, variables: Mapping[str, Value]) -> None:
        self.lexer = _Lexer(text)
        self.variables = variables
        self.error: str | None = None
        self.look: tuple[str, str] | None = None
        self.depth = 0

    def run(self) -> Value:
        try:
            result = self.expr()
            if self.peek()[0] != "eof":
                self.syntax_error()
        except _SyntaxError:
            lex = self.lexer
            raise CalcError(self.error or f"parse error: syntax error at line {lex.line}, col {lex.col}") from None
        if result is None:
            raise CalcError(self.error or "no result from parser")
        negative = result.quantity.sign() < 0 if result.quantity is not None else result.number < 0
        if negative:
            raise CalcError(f"calculation result is negative: {result}")
        return result

    # -- tokens ------------------------------------------------------------------------------------
    def peek(self) -> tuple[str, str]:
        if self.look is None:
            self.look = self.lexer.token()
        return self.look

    def take(self, op: str) -> bool:
        if self.peek() == ("op", op):
            self.look = None
            return True
        return False

    def syntax_error(self) -> None:
        raise _SyntaxError

    def fail(self, message: str) -> None:
        self.error = message

    # -- grammar -----------------------------------------------------------------------------------
    def expr(self) -> Value | None:
        left = self.term()
        while True:
            if self.take("+"):
                left = self.arith("+", left, self.term())
            elif self.take("-"):
                left = self.arith("-", left, self.term())
            else:
                return left

    def term(self) -> Value | None:
        left = self.factor()
        while True:
            if self.take("*"):
                left = self.arith("*", left, self.factor())
            elif self.take("/"):
                left = self.arith("/", left, self.factor())
            else:
                return left

    def factor(self) -> Value | None:
        negations = 0
        while self.take("-"):
            negations += 1
        value = self.operand()
        for _ in range(negations):
            value = _negate(value)
        return value

    def operand(self) -> Value | None:
        kind, text = self.peek()
        if kind == "op" and text == "(":
            self.look = None
            value = self.nested(self.expr)
            if not self.take(")"):
                self.syntax_error()
            return value
        if kind == "num":
            self.look = None
            return number(_parse_number(text))
        if kind == "qty":
            self.look = None
            try:
                return of(quantity.parse(text))
            except QuantityError as e:
                self.fail(str(e))
                return None
        if kind != "ident":
            self.syntax_error()
        self.look = None
        if self.take("("):
            return self.nested(lambda: self.call(text))
        name = _display(text).lower()
        found = self.variables.get(name)
        if found is None:
            self.fail(f"undefined variable: {name}")
        return found

    def nested(self, parse: Callable[[], Value | None]) -> Value | None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CalcError(f"expression nested more than {MAX_DEPTH} levels deep")
        try:
            return parse()
        finally:
            self.depth -= 1

    def call(self, name: str) -> Value | None:
        args = [self.expr()]
        if self.take(","):
            args.append(self.expr())
        if not self.take(")"):
            self.syntax_error()
        shown = _display(name)
        func = shown.lower()
        if func not in ("max", "min"):
            self.fail(f"unknown function: {shown}")
            return None
        if len(args) != 2:
            self.fail(f"{func} function requires exactly 2 arguments, got {len(args)}")
            return None
        a, b = args
        if a is None or b is None:
            return None
        return _extreme(a, b, want=1 if func == "max" else -1)

    # -- arithmetic --------------------------------------------------------------------------------
    def arith(self, op: str, left: Value | None, right: Value | None) -> Value | None:
        if left is None or right is None:
            return None
        lq, rq = left.quantity, right.quantity
        if op in "+-":
            if lq is None and rq is None:
                return number(left.number + right.number if op == "+" else left.number - right.number)
            addend = right.as_quantity()
            return of(left.as_quantity().add(addend if op == "+" else addend.neg()))
        if op == "*":
            if lq is not None and rq is not None:
                self.fail("multiplication of two quantities")
                return None
            if lq is not None:
                return of(lq.set_milli(float_to_int64(float(lq.milli_value()) * right.number)))
            if rq is not None:
                return of(rq.set_milli(float_to_int64(float(rq.milli_value()) * left.number)))
            return number(left.number * right.number)
        if rq is not None:
            self.fail("division by quantity")
            return None
        if right.number == 0:
            self.fail("division by zero")
            return None
        if lq is not None:
            return of(lq.set_milli(float_to_int64(float(lq.milli_value()) / right.number)))
        return number(left.number / right.number)


def _negate(value: Value | None) -> Value | None:
    if value is None:
        return None
    return of(value.quantity.neg()) if value.quantity is not None else number(-value.number)


def _extreme(a: Value, b: Value, *, want: int) -> Value:
    """max (want=1) or min (want=-1) as Kruise picks: ties keep `a`; a number beside a Quantity
    is compared, and returned, as milli-units."""
    if a.quantity is None and b.quantity is None:
        keep_a = a.number >= b.number if want > 0 else a.number <= b.number
        return a if keep_a else b
    qa, qb = a.as_quantity(), b.as_quantity()
    c = qa.cmp(qb)
    return of(qa) if (c >= 0 if want > 0 else c <= 0) else of(qb)

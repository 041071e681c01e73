"""Kruise's resource expression language: the expected values and errors of Kruise's own calculator
tests (pkg/util/calculator/calculator_test.go) and of its results measured against apimachinery."""

from __future__ import annotations

import pytest

from sidecarsets.values import calculator, quantity
from sidecarsets.values.calculator import CalcError, Value


def q(text: str) -> Value:
    return calculator.of(quantity.parse(text))


def run(expr: str, **variables: Value) -> str:
    return str(calculator.evaluate(expr, variables))


@pytest.mark.parametrize(
    ("expr", "result"),
    [
        ("2 + 3", "5"),
        ("(2 + 3) * 4", "20"),
        ("50%", "0.5"),
        ("100% * 2", "2"),
        ("1e2", "100"),
        ("1E2", "100"),
        ("1e-3", "0.001"),
        ("2.5E+1", "25"),
        ("min(max(max(max(0.5,0.5*0.5),0.5-1.0),0.5-1.0),3.0)", "0.5"),
        ("40m + 20m", "60m"),
        ("100Mi - 50Mi", "50Mi"),
        ("2 * 40m", "80m"),
        ("100m / 2", "50m"),
        ("max(40m, 20)", "20"),
        ("min(40m, 20m)", "20m"),
        ("min(max(max(max(500m,0.5*0.5),0.5-1.0),0.5-1.0),3.0)", "500m"),
        ("0m + 0m", "0"),
        ("1000Gi + 500Gi", "1500Gi"),
        ("1.5Gi * 2", "3Gi"),
        ("1Gi + 100Mi", "1124Mi"),
        ("(100m + 50m) * 2 - 50m", "250m"),
        ("max(100m * 50%, 30m)", "50m"),
        ("max(10 + 5, 20 - 5) * 2", "30"),
        ("max(100m, min(200m, 150m)) + 50m", "200m"),
        ("10+-5", "5"),
        ("10--5", "15"),
        ("20+-10+5", "15"),
        ("1e3+-200", "800"),
        ("2+3+4/2", "7"),
        ("100m + 1Gi", "1073741824100m"),
        ("1.5Gi", "1536Mi"),
        ("1Gi * 50%", "512Mi"),
        ("0.1 + 0.2", "0.30000000000000004"),
        ("-2*3 + 10", "4"),  # unary minus takes one factor
        (".5m", "500u"),
        # A number that does not parse as a float reads as 0.
        ("1gi", "0"),
        ("100mi", "0"),
        ("2E", "0"),
        ("1e", "0"),
        ("MAX(1, 2)", "2"),  # function names ignore case
        # A NUL byte ends the input, as in Kruise's lexer.
        ("1\x00 garbage", "1"),
    ],
)
def test_constant_expressions(expr: str, result: str) -> None:
    assert run(expr) == result


@pytest.mark.parametrize(
    ("expr", "variables", "result"),
    [
        ("cpu*2", {"cpu": "50m"}, "100m"),
        ("max(cpu, 200m)", {"cpu": "100m"}, "200m"),
        ("min(max(max(max(0.5,0.5*cpu),cpu-1.0),cpu-1.0),3.0)", {"cpu": "0.5"}, "500m"),
        ("min(0.8, cpu)", {"cpu": "1.0"}, "800m"),
        ("min(cpu, 1.5)", {"cpu": "2.0"}, "1500m"),
        ("max(min(2*cpu,-cpu+3.0),2*cpu-3.0)", {"cpu": "1.5"}, "1500m"),
        ("memory + 100Mi", {"memory": "200Mi"}, "300Mi"),
        ("0.5 * memory + max(0, memory-2Gi)", {"memory": "8Gi"}, "10Gi"),
        ("cpu*50%", {"cpu": "200m"}, "100m"),
        ("cpu*50%", {"cpu": "1m"}, "0"),  # milli-units, truncated
        ("cpu/3", {"cpu": "1"}, "333m"),
        ("cpu/7", {"cpu": "1"}, "142m"),
        ("cpu*33%", {"cpu": "100m"}, "33m"),
        ("cpu * 1.1", {"cpu": "3"}, "3300m"),
        ("min(cpu, 0.3)", {"cpu": "1"}, "300m"),
        ("max(1, cpu)", {"cpu": "500m"}, "1"),
        ("cpu + 1", {"cpu": "500m"}, "1500m"),
        ("memory*30%", {"memory": "1Gi"}, "322122547200m"),  # milli-bytes: not a whole binary value
        ("memory/3", {"memory": "1Gi"}, "357913941333m"),
        ("memory*50%", {"memory": "1G"}, "500M"),
        ("memory + 100", {"memory": "1Gi"}, "1073741924"),
        ("0.5*cpu - 0.3*max(0, cpu-4) + 0.3*max(0, cpu-8)", {"cpu": "10"}, "3800m"),
        ("CPU * 2", {"cpu": "1"}, "2"),  # variable names ignore case
        ("max(cpu, 1m)", {"cpu": "+1"}, "+1"),  # a pod's value passes through as Go keeps it
    ],
)
def test_expressions_over_a_variable(expr: str, variables: dict[str, str], result: str) -> None:
    assert run(expr, **{name: q(text) for name, text in variables.items()}) == result


def test_an_absent_request_is_go_zero() -> None:
    zero = calculator.of(quantity.Quantity())
    assert run("max(cpu*50%, 50m)", cpu=zero) == "50m"
    assert run("cpu*50%", cpu=zero) == "0"


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("5..5", "parse error: syntax error at line 1, col 5"),
        ("5%%", "parse error: syntax error at line 1, col 4"),
        ("", "parse error: syntax error at line 1, col 1"),
        ("   ", "parse error: syntax error at line 1, col 4"),
        ("2 + @", "parse error: syntax error at line 1, col 6"),
        ("(2 + 3", "parse error: syntax error at line 1, col 7"),
        ("()", "parse error: syntax error at line 1, col 3"),
        ("max()", "parse error: syntax error at line 1, col 6"),
        ("max(10, 20, 30)", "parse error: syntax error at line 1, col 12"),
        ("1\n+ *", "parse error: syntax error at line 2, col 4"),
        ("+5", "parse error: syntax error at line 1, col 2"),  # no unary plus
        ("1Ei", "parse error: syntax error at line 1, col 4"),  # 1E then the identifier i
        ("10 / 0", "division by zero"),
        ("unknown(1, 2)", "unknown function: unknown"),
        ("Foo(1)", "unknown function: Foo"),
        ("40m * 2m", "multiplication of two quantities"),
        ("2 / 40m", "division by quantity"),
        ("-10", "calculation result is negative: -10"),
        ("-100m", "calculation result is negative: -100m"),
        ("10 - 20", "calculation result is negative: -10"),
        ("50m - 100m", "calculation result is negative: -50m"),
        ("-1e7", "calculation result is negative: -1e+07"),
        ("max(10)", "max function requires exactly 2 arguments, got 1"),
        ("max(10, 20 / 0)", "division by zero"),
        ("1e3m", quantity.ERR_FORMAT),
        ("Memory", "undefined variable: memory"),
    ],
)
def test_errors(expr: str, message: str) -> None:
    with pytest.raises(CalcError) as err:
        calculator.evaluate(expr, {"cpu": calculator.number(1.0)})
    assert str(err.value) == message


def test_a_semantic_error_wins_over_a_later_syntax_error() -> None:
    with pytest.raises(CalcError, match=r"^undefined variable: invalid$"):
        calculator.evaluate("invalid expression @#$", {})


def test_the_last_semantic_error_wins() -> None:
    with pytest.raises(CalcError, match=r"^division by zero$"):
        calculator.evaluate("x + 1/0", {})
    with pytest.raises(CalcError, match=r"^undefined variable: x$"):
        calculator.evaluate("1/0 + x", {})
    # A call with a failed argument still reports its own arity.
    with pytest.raises(CalcError, match=r"^max function requires exactly 2 arguments, got 1$"):
        calculator.evaluate("max(foo)", {})


def test_nesting_is_bounded() -> None:
    deep = "(" * (calculator.MAX_DEPTH + 1) + "1" + ")" * (calculator.MAX_DEPTH + 1)
    with pytest.raises(CalcError, match="nested more than"):
        calculator.evaluate(deep, {})
    ok = "(" * calculator.MAX_DEPTH + "1" + ")" * calculator.MAX_DEPTH
    assert run(ok) == "1"
    assert run("-" * 5000 + "1") == "1"  # unary minus is not nesting


def test_non_ascii_is_read_byte_by_byte_as_kruise_does() -> None:
    # "é" is two bytes; the first is a Latin-1 letter, so it is read as a (bad) variable name.
    with pytest.raises(CalcError, match=r"^undefined variable: "):
        calculator.evaluate("é", {})

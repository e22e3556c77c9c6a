"""``fun2ms``: a match spec written as a Python function, as Erlang's ``ets:fun2ms/1`` makes one
from a fun.

The function's parameters are the object's elements (a name binds a ``Var``, a ``_``-prefixed
name matches anything, a default is a literal the element must equal exactly); its body is a
sequence of ``if GUARD: return RESULT`` clauses, optionally ending with ``return RESULT``. The
source is read with ``inspect``, so the function must live in a file, not a REPL.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

from ._errors import EtsError
from ._guards import FUNCTIONS
from ._match import ANY, BINDINGS, OBJECT, Var

_COMPARE: dict[type[ast.cmpop], str] = {
    ast.Lt: "<",
    ast.LtE: "=<",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "/=",
    ast.Is: "=:=",
    ast.IsNot: "=/=",
    ast.In: "in",
}
_BINARY: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.BitAnd: "band",
    ast.BitOr: "bor",
    ast.BitXor: "bxor",
    ast.LShift: "bsl",
    ast.RShift: "bsr",
}
_UNARY: dict[type[ast.unaryop], str] = {
    ast.Not: "not",
    ast.USub: "-",
    ast.UAdd: "+",
    ast.Invert: "bnot",
}
_MARKERS = {"OBJECT": OBJECT, "BINDINGS": BINDINGS}


def _bad(fn: Callable[..., Any], message: str) -> EtsError:
    name = getattr(fn, "__qualname__", repr(fn))
    return EtsError(f"ets.fun2ms({name}): {message}", operation="fun2ms")


def fun2ms(fn: Callable[..., Any]) -> list[tuple[Any, list[Any], Any]]:
    """The match spec that ``fn`` describes (Erlang's ``ets:fun2ms/1``).

    Example::

        def adults(name, age, _city):
            if age >= 18 and is_integer(age):
                return name

        ets.select(t, ets.fun2ms(adults))
        # == ets.select(t, [((Var(1), Var(2), ANY), [("andalso", (">=", Var(2), 18),
        #                   ("is_integer", Var(2)))], Var(1))])

    In guards: comparisons (``<``, ``<=`` as ``=<``, ``==``, ``!=`` as ``/=``, ``is`` as ``=:=``,
    ``is not`` as ``=/=``, ``in``), ``and``/``or`` (``andalso``/``orelse``), ``not``,
    arithmetic and bit operators (``//`` and ``%`` stay Python's floor; call ``div``/``rem``
    for Erlang's), calls of guard functions by name (``abs(x)``, ``element(0, t)``,
    ``self()``), literals, and names from the function's closure or globals (taken as
    constants). A result is a template: parameters, ``OBJECT``, ``BINDINGS``, literals,
    tuples and lists.

    Raises:
        EtsError: ``fn`` has no readable source, or uses something the match spec language
            has no counterpart for (the message says what).
    """
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError) as exc:
        raise _bad(fn, f"its source cannot be read ({exc}); define it with def in a file") from None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, ast.FunctionDef):
        raise _bad(fn, "fun2ms takes a function defined with def (not a lambda)")
    args = node.args
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
        raise _bad(fn, "only plain parameters, one per element of the object")
    params = args.args
    defaults: dict[str, Any] = {}
    for param, default in zip(
        params[len(params) - len(args.defaults) :], args.defaults, strict=True
    ):
        defaults[param.arg] = _literal(fn, default)
    variables: dict[str, Var] = {}
    head = []
    for param in params:
        if param.arg in defaults:
            head.append(defaults[param.arg])
        elif param.arg.startswith("_"):
            head.append(ANY)
        else:
            variables[param.arg] = Var(len(variables) + 1)
            head.append(variables[param.arg])
    env = _environment(fn)
    env.update(defaults)  # a parameter with a default stands for that literal
    translate = _Translator(fn, variables, env)
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    spec: list[tuple[Any, list[Any], Any]] = []
    for statement in body:
        if isinstance(statement, ast.If) and not statement.orelse and len(statement.body) == 1:
            returned = statement.body[0]
            if isinstance(returned, ast.Return) and returned.value is not None:
                guard = translate.guard(statement.test)
                spec.append((tuple(head), [guard], translate.result(returned.value)))
                continue
        if isinstance(statement, ast.Return) and statement.value is not None:
            spec.append((tuple(head), [], translate.result(statement.value)))
            continue
        raise _bad(
            fn,
            f"line {statement.lineno}: the body is 'if GUARD: return RESULT' clauses and"
            " an optional final 'return RESULT'",
        )
    if not spec:
        raise _bad(fn, "the body has no 'return RESULT'")
    return spec


def _literal(fn: Callable[..., Any], node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise _bad(fn, f"line {node.lineno}: a default must be a literal") from None


def _environment(fn: Callable[..., Any]) -> dict[str, Any]:
    env = dict(getattr(fn, "__globals__", {}))
    code = getattr(fn, "__code__", None)
    closure = getattr(fn, "__closure__", None) or ()
    if code is not None:
        for name, cell in zip(code.co_freevars, closure, strict=True):
            try:
                env[name] = cell.cell_contents
            except ValueError:
                continue  # not assigned yet
    return env


class _Translator:
    def __init__(self, fn: Callable[..., Any], variables: dict[str, Var], env: dict[str, Any]):
        self.fn = fn
        self.variables = variables
        self.env = env

    def _bad(self, node: ast.AST, what: str) -> EtsError:
        return _bad(self.fn, f"line {getattr(node, 'lineno', '?')}: {what}")

    def _name(self, node: ast.Name) -> Any:
        var = self.variables.get(node.id)
        if var is not None:
            return var
        if node.id in _MARKERS:
            return _MARKERS[node.id]
        if node.id in self.env:
            value = self.env[node.id]
            if value is OBJECT or value is BINDINGS:
                return value
            return ("const", value)
        raise self._bad(node, f"{node.id!r} is neither a parameter nor a known name")

    def guard(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Name):
            return self._name(node)
        if isinstance(node, ast.Attribute) and node.attr in _MARKERS:
            return _MARKERS[node.attr]
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.BoolOp):
            op = "andalso" if isinstance(node.op, ast.And) else "orelse"
            return (op, *[self.guard(value) for value in node.values])
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return (_UNARY[type(node.op)], self.guard(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return (_BINARY[type(node.op)], self.guard(node.left), self.guard(node.right))
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.keywords or node.func.id not in FUNCTIONS:
                raise self._bad(node, f"{node.func.id}(...) is not a guard function")
            return (node.func.id, *[self.guard(arg) for arg in node.args])
        if isinstance(node, ast.Tuple):
            try:
                return ("const", ast.literal_eval(node))
            except ValueError:
                pass  # not all literals: built from its elements below
        if isinstance(node, ast.Tuple | ast.List):
            items = [self.guard(item) for item in node.elts]
            if isinstance(node, ast.List):
                return items
            if items and isinstance(items[0], str):
                raise self._bad(node, "a tuple built in a guard cannot start with a str")
            return tuple(items)
        raise self._bad(node, f"{ast.unparse(node)!r} has no match spec counterpart")

    def _compare(self, node: ast.Compare) -> Any:
        tests: list[tuple[Any, ...]] = []
        left = self.guard(node.left)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = self.guard(comparator)
            if isinstance(op, ast.NotIn):
                tests.append(("not", ("in", left, right)))
            elif type(op) in _COMPARE:
                tests.append((_COMPARE[type(op)], left, right))
            else:
                raise self._bad(node, f"{type(op).__name__} has no match spec counterpart")
            left = right
        return tests[0] if len(tests) == 1 else ("andalso", *tests)

    def result(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Name):
            value = self._name(node)
            return value[1] if isinstance(value, tuple) else value
        if isinstance(node, ast.Attribute) and node.attr in _MARKERS:
            return _MARKERS[node.attr]
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Tuple):
            return tuple(self.result(item) for item in node.elts)
        if isinstance(node, ast.List):
            return [self.result(item) for item in node.elts]
        raise self._bad(
            node,
            f"a result is a template (parameters, OBJECT, literals, tuples, lists), not"
            f" {ast.unparse(node)!r}",
        )

"""Tools, policies and the error envelope are values validated when built."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps import dispatcher as d

from .helpers import ADD_SCHEMA, Script, add


def test_a_tool_compiles_its_schema_and_describes_itself_for_mcp() -> None:
    tool = d.Tool("add", add, ADD_SCHEMA, annotations={"idempotentHint": True}, description="a+b")
    assert tool.idempotent is True
    assert tool.mode == "async"
    assert tool.to_mcp() == {
        "name": "add",
        "inputSchema": ADD_SCHEMA,
        "description": "a+b",
        "annotations": {"idempotentHint": True},
    }
    assert d.ToolRegistry([tool]).to_mcp() == [tool.to_mcp()]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "Tool.name must be a non-empty str (got '')"),
        ({"handler": 3}, "Tool.handler must be an async function, a sync function"),
        ({"schema": {"type": "nope"}}, "Tool 't': its schema is not a valid JSON Schema"),
        ({"schema": [1]}, "Tool.schema must be a JSON Schema object (a dict) or None"),
        ({"timeout": -1}, "Tool.timeout must be a finite number > 0 or None (got -1)"),
        ({"max_concurrency": 0}, "Tool.max_concurrency must be an int >= 1 (got 0)"),
        ({"idempotent": "yes"}, "Tool 't': idempotent must be True or False (got 'yes')"),
        ({"retry": 3}, "Tool 't': retry must be a RetryPolicy (got 3)"),
        ({"timeout_ms": 0}, "Tool.timeout_ms must be a finite number of milliseconds > 0"),
        (
            {"schema": {"properties": {"s": {"pattern": "(a)\\1"}}}},
            "Tool 't': pattern '(a)\\\\1' uses a backreference, which needs a backtracking",
        ),
        (
            {"schema": {"patternProperties": {"^(?=x)": {}}}},
            "Tool 't': pattern '^(?=x)' uses a lookahead or lookbehind, which needs a",
        ),
        (
            {"schema": {"properties": {"s": {"pattern": "a{1,5000}"}}}},
            "Tool 't': pattern 'a{1,5000}' needs more than 2000 states",
        ),
        (
            {"schema": {"patternProperties": {"^x": {}}, "unevaluatedProperties": False}},
            "Tool 't': its schema combines patternProperties with unevaluatedProperties",
        ),
    ],
)
def test_a_bad_tool_is_rejected_with_a_message_naming_the_field(
    kwargs: dict[str, Any], message: str
) -> None:
    fields: dict[str, Any] = {"name": "t", "handler": add, "idempotent": True, **kwargs}
    with pytest.raises(d.ConfigurationError) as caught:
        d.Tool(**fields)
    assert str(caught.value).startswith(message)


def test_policies_validate_their_fields() -> None:
    with pytest.raises(d.ConfigurationError, match=r"RetryPolicy.max_attempts must be an int"):
        d.RetryPolicy(max_attempts=0)
    with pytest.raises(d.ConfigurationError, match=r"BreakerPolicy.window must be a finite"):
        d.BreakerPolicy(window=0)
    with pytest.raises(d.ConfigurationError, match=r"Budget.calls must be an int >= 0"):
        d.Budget(calls=-1)
    with pytest.raises(d.ConfigurationError, match=r"DispatcherConfig.result_ttl must be"):
        d.DispatcherConfig(result_ttl=0)


def test_the_default_retry_schedule_is_0_then_x4_growth_with_half_jitter() -> None:
    policy = d.RetryPolicy()
    assert [policy.delay(n) for n in (1, 2, 3)] == [0.0, 0.1, 0.4]
    rng = random.Random(1)
    for _ in range(100):
        assert 0.1 <= policy.delay(2, rng) <= 0.15
        assert 0.4 <= policy.delay(3, rng) <= 0.6


@pytest.mark.parametrize(
    ("kind", "code", "cls"),
    [
        ("timeout", -32000, d.DispatchTimeout),
        ("transient", -32001, d.TransientFailure),
        ("schema", -32602, d.InvalidArguments),
        ("not_found", -32601, d.ToolNotFound),
        ("internal", -32603, d.InternalError),
        ("budget_exceeded", -32002, d.BudgetExceeded),
        ("circuit_open", -32003, d.CircuitOpen),
        ("conflict", -32004, d.IdempotencyConflict),
    ],
)
def test_each_kind_has_its_class_and_json_rpc_code(
    kind: str, code: int, cls: type[d.DispatchError]
) -> None:
    error = d.DispatchError.make(kind, "it failed", attempts=2, data={"tool": "t"})
    assert type(error) is cls and error.kind == kind
    assert isinstance(error, d.DispatcherError)
    assert error.to_jsonrpc() == {
        "code": code,
        "message": "it failed",
        "data": {"kind": kind, "attempts": 2, "tool": "t"},
    }
    assert -32099 <= code <= -32000 or code in (-32601, -32602, -32603)
    mcp = error.to_mcp()
    if kind == "not_found":
        assert mcp["error"]["code"] == -32602
    else:
        assert mcp["result"]["isError"] is True
        assert mcp["result"]["content"] == [{"type": "text", "text": "it failed"}]


_ATOMS = ["a", "b", "A", ".", "[ab]", "[^a]", r"\d", r"\w", r"\s", r"\W", "^", "$"]
_ATOMS += [r"\b", r"\B", r"\A", r"\Z", "", r"\n"]
patterns = st.recursive(
    st.sampled_from(_ATOMS),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map("".join),
        st.tuples(inner, inner).map(lambda pair: f"(?:{pair[0]}|{pair[1]})"),
        inner.map(lambda x: f"({x})"),
        st.tuples(inner, st.sampled_from(["*", "+", "?", "{1,3}", "{2}", "*?", "{0,2}"])).map(
            lambda pair: f"(?:{pair[0]}){pair[1]}"
        ),
    ),
    max_leaves=8,
)
flags = st.sampled_from(["", "(?i)", "(?m)", "(?s)", "(?a)"])


@settings(max_examples=200, deadline=None)
@given(flags, patterns, st.lists(st.text(alphabet="abA1 _\n.", max_size=8), max_size=4))
def test_schema_patterns_match_exactly_as_re_search_does(
    flag: str, body: str, texts: list[str]
) -> None:
    pattern = flag + body
    tool = d.Tool("t", add, {"properties": {"s": {"pattern": pattern}}}, idempotent=True)
    keyed = d.Tool("k", add, {"patternProperties": {pattern: {"type": "integer"}}}, idempotent=True)
    for text in texts:  # one tool, several texts: what a pattern remembers must not leak
        assert tool.validator.is_valid({"s": text}) == (re.search(pattern, text) is not None)
        assert keyed.validator.is_valid({text: "x"}) == (re.search(pattern, text) is None)


def test_a_schema_with_an_unresolvable_ref_is_rejected_when_the_tool_is_built() -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    with pytest.raises(d.ConfigurationError, match="schema"):
        d.Tool("t", Script(), schema, idempotent=True)


@pytest.mark.parametrize(
    "schema",
    [{"type": "array"}, {"properties": {"a": {"type": "integer"}}}],
    ids=["array", "no-type"],
)
def test_a_tools_input_schema_is_an_mcp_object_schema(schema: dict[str, Any]) -> None:
    try:
        tool = d.Tool("t", Script(), schema, idempotent=True)
    except d.ConfigurationError as error:
        assert "object" in str(error)
        return
    assert schema.get("type", "object") == "object", "a non-object schema must be rejected"
    assert tool.to_mcp()["inputSchema"]["type"] == "object"

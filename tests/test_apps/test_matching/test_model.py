"""Flow types, Steps, RPCs and the registry (apps.matching's model), and state patches."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apps.matching import (
    NOT_YET,
    ConfigurationError,
    Flow,
    Registry,
    RetryPolicy,
    StepContext,
    UnknownFlowType,
    apply_patch,
    rpc,
    state_patch,
    step,
    subflow,
    wait_for,
)
from apps.matching._flow_spec import MAX_DEPTH, parse_definition


class GreetingFlow(Flow):
    name = "Greeting"

    @step(retry=RetryPolicy(max_attempts=5, initial_backoff=0.5))
    async def greet(self, ctx, who):
        ctx.state["greeting"] = f"Hello, {who}!"
        return ctx.state["greeting"]

    @step(timeout=30)
    async def shout(self, ctx, text):
        return text.upper()

    @rpc
    async def greeting(self, ctx):
        return ctx.state.get("greeting")


class SyncFlow(Flow):
    @step
    def only(self, ctx):
        return 1

    @rpc(name="peek")
    def look(self, ctx):
        return ctx.state


def test_steps_keep_declaration_order_and_options():
    definition = GreetingFlow().definition()
    assert definition.name == "Greeting"
    assert [s.name for s in definition.steps] == ["greet", "shout"]
    assert [s.index for s in definition.steps] == [0, 1]
    assert definition.steps[0].retry == RetryPolicy(max_attempts=5, initial_backoff=0.5)
    assert definition.steps[1].timeout == 30
    assert definition.steps[1].retry == RetryPolicy()
    assert list(definition.rpcs) == ["greeting"]
    assert definition.capabilities() == {"steps": ["greet", "shout"], "rpcs": ["greeting"]}


def test_flow_name_defaults_to_the_class_name_and_rpc_names_can_be_set():
    definition = SyncFlow().definition()
    assert definition.name == "SyncFlow"
    assert list(definition.rpcs) == ["peek"]


def test_a_subclass_override_keeps_the_step_position():
    class Louder(GreetingFlow):
        name = "Louder"

        @step
        async def greet(self, ctx, who):
            return who

    definition = Louder().definition()
    assert [s.name for s in definition.steps] == ["greet", "shout"]
    assert definition.steps[0].retry == RetryPolicy()


def test_registry_refuses_async_handlers_unless_allowed():
    with pytest.raises(ConfigurationError, match="allow_async_handlers=True"):
        Registry((GreetingFlow(),))
    registry = Registry((GreetingFlow(), SyncFlow), allow_async_handlers=True)
    assert registry.flow_types == ("Greeting", "SyncFlow")
    assert "Greeting" in registry and len(registry) == 2
    assert registry.capabilities()["SyncFlow"] == {"steps": ["only"], "rpcs": ["peek"]}


def test_a_workers_definitions_are_what_start_flow_pins():
    registry = Registry((GreetingFlow(), SyncFlow), allow_async_handlers=True)
    definitions = registry.definitions()
    assert definitions == {name: registry.get(name).to_wire() for name in ("Greeting", "SyncFlow")}
    first, second = definitions["Greeting"]["steps"]
    assert (first["name"], first["max_attempts"], first["initial_backoff"]) == ("greet", 5, 0.5)
    assert (second["name"], second["timeout"]) == ("shout", 30.0)
    assert definitions["Greeting"]["rpcs"] == ["greeting"]
    assert parse_definition(definitions["Greeting"]).steps[0].retry == RetryPolicy(
        max_attempts=5, initial_backoff=0.5
    )


def test_registry_refuses_two_flows_of_one_name():
    class Other(Flow):
        name = "SyncFlow"

    with pytest.raises(ConfigurationError, match="two flows are named 'SyncFlow'"):
        Registry((SyncFlow, Other))


def test_registry_refuses_what_is_not_a_flow():
    with pytest.raises(ConfigurationError, match="Flow instances or Flow subclasses"):
        Registry((object(),))  # type: ignore[arg-type]


def test_unknown_flow_type_names_the_known_ones():
    registry = Registry((SyncFlow,))
    with pytest.raises(
        UnknownFlowType, match=r"'Nope' is not in this registry \(it has: SyncFlow\)"
    ):
        registry.get("Nope")
    assert registry.flow_type_of(SyncFlow) == "SyncFlow"
    assert registry.flow_type_of(SyncFlow()) == "SyncFlow"
    assert registry.flow_type_of("x") == "x"
    with pytest.raises(ConfigurationError):
        registry.flow_type_of(3)  # type: ignore[arg-type]


def test_two_steps_of_one_name_are_refused():
    class Twice(Flow):
        @step(name="a")
        def one(self, ctx):
            pass

        @step(name="a")
        def two(self, ctx):
            pass

    with pytest.raises(ConfigurationError, match="two steps named 'a'"):
        Twice().definition()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be an int >= 1"),
        ({"max_attempts": 1.5}, "max_attempts must be an int >= 1"),
        ({"initial_backoff": -1}, "initial_backoff must be a number >= 0"),
        ({"backoff_coefficient": 0.5}, "backoff_coefficient must be a number >= 1"),
        ({"max_backoff": "x"}, "max_backoff must be a number >= 0"),
        ({"non_retryable_errors": "ValueError"}, "non_retryable_errors must be a list"),
        ({"non_retryable_errors": [""]}, "non_retryable_errors must hold at most 64"),
        ({"non_retryable_errors": ["E"] * 65}, "non_retryable_errors must hold at most 64"),
    ],
)
def test_retry_policy_is_validated(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        RetryPolicy(**kwargs)


def test_backoff_grows_and_is_capped():
    policy = RetryPolicy(max_attempts=10, initial_backoff=1, backoff_coefficient=2, max_backoff=5)
    assert [policy.backoff(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_bad_step_options_are_refused():
    with pytest.raises(ConfigurationError, match="must be a RetryPolicy"):
        step(retry=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"@step\(timeout=...\) must be a number"):
        step(timeout=0)
    with pytest.raises(ConfigurationError, match="flow type name must be a non-empty str"):

        class Empty(Flow):
            name = ""


def test_step_context_output_reaches_its_emitter():
    seen = []
    ctx = StepContext("f", "T", "s", "f/0/s", 1, {}, emit=seen.append)
    ctx.output({"progress": 1})
    assert seen == [{"progress": 1}]
    StepContext("f", "T", "s", "f/0/s", 1, {}).output("ignored without an emitter")


def test_state_patch_sends_only_changes():
    before = {"a": 1, "b": [1], "c": 3}
    after = {"a": 1, "b": [1, 2], "d": 4}
    assert state_patch(before, after) == {"set": {"b": [1, 2], "d": 4}, "delete": ["c"]}
    assert apply_patch({"x": 1}, None) == {"x": 1}
    with pytest.raises(ValueError, match="a state patch is"):
        apply_patch({}, {"set": [], "delete": []})


_values = st.one_of(st.integers(), st.text(max_size=3), st.lists(st.integers(), max_size=2))
_states = st.dictionaries(st.text(max_size=3), _values, max_size=6)


@given(_states, _states)
def test_a_patch_turns_before_into_after(before, after):
    assert apply_patch(before, state_patch(before, after)) == after


@given(_states, _states, _states)
def test_patches_of_disjoint_keys_both_survive(base, one, two):
    # A Step and an RPC change different keys of one state: neither undoes the other.
    base = {f"c{k}": v for k, v in base.items()}  # (keys neither side changes)
    a = {**base, **{f"a{k}": v for k, v in one.items()}}
    b = {**base, **{f"b{k}": v for k, v in two.items()}}
    merged = apply_patch(apply_patch(base, state_patch(base, a)), state_patch(base, b))
    assert merged == {**a, **b}


# -- Step kinds -----------------------------------------------------------------------------------


class Charge(Flow):
    @step
    def pay(self, ctx, amount):
        return amount


class Order(Flow):
    @step
    def price(self, ctx, n):
        return n

    charge = subflow(Charge, retry=RetryPolicy(max_attempts=2), timeout=60)
    refund = subflow(Charge(), name="give_back")

    @wait_for(timeout=30, retry=RetryPolicy(non_retryable_errors=["Fatal"]))
    def shipped(self, ctx, receipt):
        return ctx.state.get("shipped", NOT_YET)

    @rpc
    def ship(self, ctx):
        ctx.state["shipped"] = True


def test_step_kinds_keep_their_order_and_a_subflow_names_its_child():
    definition = Order().definition()
    kinds = [(s.name, s.kind, s.timeout) for s in definition.steps]
    assert kinds == [
        ("price", "execute", None),
        ("charge", "subflow", 60),
        ("give_back", "subflow", None),
        ("shipped", "wait_for", 30),
    ]
    assert isinstance(definition.steps[1].child, Charge)
    assert definition.steps[1].retry == RetryPolicy(max_attempts=2)
    assert definition.steps[3].retry.non_retryable_errors == ("Fatal",)
    # a worker runs the Execute and WaitFor steps only: the server runs SubFlows
    assert definition.capabilities() == {"steps": ["price", "shipped"], "rpcs": ["ship"]}
    assert repr(NOT_YET) == "NOT_YET"


def test_a_subflow_definition_carries_its_childs_and_round_trips():
    wire_form = Order().definition().to_wire()
    steps = wire_form["steps"]
    assert [(s["name"], s["kind"]) for s in steps][1:] == [
        ("charge", "subflow"),
        ("give_back", "subflow"),
        ("shipped", "wait_for"),
    ]
    assert steps[1]["flow_type"] == "Charge"
    assert steps[1]["definition"] == Charge().definition().to_wire()
    assert steps[3]["non_retryable_errors"] == ["Fatal"]
    spec = parse_definition(wire_form)
    assert spec.to_wire() == wire_form
    assert spec.to_wire() is spec.to_wire()  # (built once: every flow of the spec pins it)
    assert spec.steps[1].child == parse_definition(Charge().definition().to_wire())
    assert spec.steps[3].retry.non_retryable_errors == ("Fatal",)


def test_a_recursive_subflow_leaves_its_own_definition_out():
    class Tree(Flow):
        @step
        def grow(self, ctx, n):
            return n

        branch = subflow("Tree")  # (by name: the class is not defined yet)

    class Forest(Flow):
        trees = subflow(Tree)

    steps = Forest().definition().to_wire()["steps"]
    assert steps[0]["definition"] == Tree().definition().to_wire()
    inner = steps[0]["definition"]["steps"][1]
    assert (inner["kind"], inner["flow_type"]) == ("subflow", "Tree")
    assert "definition" not in inner  # the server takes the one it knows


def test_bad_step_kinds_and_subflows_are_refused():
    with pytest.raises(ConfigurationError, match=r"subflow\(\) takes the child's Flow"):
        subflow(3)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"@wait_for\(timeout=...\) must be a number"):
        wait_for(timeout=-1)
    entry = {"name": "s", "kind": "sleep"}
    with pytest.raises(ConfigurationError, match=r"steps\[0\].kind must be 'execute'"):
        parse_definition({"steps": [entry]})
    with pytest.raises(ConfigurationError, match=r"steps\[0\].flow_type must be a non-empty"):
        parse_definition({"steps": [{"name": "s", "kind": "subflow"}]})
    nested: dict = {"steps": []}
    for _ in range(MAX_DEPTH + 1):
        entry = {"name": "s", "kind": "subflow", "flow_type": "T", "definition": nested}
        nested = {"steps": [entry]}
    with pytest.raises(ConfigurationError, match=f"nested at most {MAX_DEPTH} deep"):
        parse_definition(nested)

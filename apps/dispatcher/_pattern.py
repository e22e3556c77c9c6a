"""Linear-time matching for the regular expressions of JSON Schema (``pattern``,
``patternProperties``), so that a hostile string cannot stall the node's event loop.

Python's ``re`` backtracks: ``^(a+)+$`` against 30 ``a`` and a ``!`` runs for minutes, and it
holds the GIL while it does (a worker thread would stall the loop just the same). A tool's
patterns are compiled here instead into a Thompson NFA (Thompson 1968; Russ Cox, "Regular
Expression Matching Can Be Simple And Fast", 2007), searched by simulating every state at once:
a search costs at most ``len(text) x states`` steps. Each step is one single-character test or
zero-width assertion run by ``re`` itself on the text at that position, so classes, categories,
flags and anchors mean exactly what they mean to ``re``. What needs backtracking
(backreferences, lookarounds, possessive and atomic groups) is refused when the tool is defined.
Every search spends from a :class:`Meter`, one per validated call, which bounds the whole call's
pattern work (``DispatcherConfig.max_pattern_steps``).
"""

from __future__ import annotations

import contextvars
import re
import re._compiler as _sre_compiler  # type: ignore[import-not-found]
import re._constants as _sre  # type: ignore[import-not-found]
import re._parser as _sre_parser  # type: ignore[import-not-found]
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
from jsonschema.exceptions import ValidationError  # type: ignore[import-untyped]

#: At most this many NFA states per pattern (a bounded repeat is unrolled).
MAX_STATES = 2_000
#: ``DispatcherConfig.max_pattern_steps`` unless configured: about 70 ms of matching, room for
#: a 10,000-character string against a pattern of ten states.
DEFAULT_MAX_STEPS = 100_000
#: Memoized steps kept per pattern (then forgotten all at once).
_MEMO_SIZE = 4_096

_CHAR, _SPLIT, _ASSERT, _MATCH = 0, 1, 2, 3
_ONE_CHAR = frozenset((_sre.LITERAL, _sre.NOT_LITERAL, _sre.ANY, _sre.IN))
_REPEATS = frozenset((_sre.MAX_REPEAT, _sre.MIN_REPEAT))  # laziness does not change a search
_BACKTRACKING = {
    _sre.GROUPREF: "a backreference",
    _sre.GROUPREF_EXISTS: "a conditional group",
    _sre.ASSERT: "a lookahead or lookbehind",
    _sre.ASSERT_NOT: "a negative lookahead or lookbehind",
    _sre.ATOMIC_GROUP: "an atomic group",
    _sre.POSSESSIVE_REPEAT: "a possessive quantifier",
}


class PatternError(ValueError):
    """A pattern cannot be matched in linear time (or is not a regular expression)."""


class PatternWorkExceeded(Exception):
    """A call's pattern checks spent their :class:`Meter`."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"pattern checks exceeded {limit} steps")
        self.limit = limit


@attrs.define
class Meter:
    """The steps a call's pattern checks may still take."""

    limit: int
    left: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.left = self.limit

    def spend(self, steps: int) -> None:
        self.left -= steps
        if self.left < 0:
            raise PatternWorkExceeded(self.limit)


#: The meter of the validation running now (set by the dispatcher around each validation).
METER: contextvars.ContextVar[Meter | None] = contextvars.ContextVar("dispatcher_meter")


@attrs.frozen(eq=False)
class LinearPattern:
    """A compiled pattern: ``search(text)`` is ``re.search(pattern, text) is not None``."""

    pattern: str
    kinds: tuple[int, ...]
    tests: tuple[Any, ...]
    out1: tuple[int, ...]
    out2: tuple[int, ...]
    start: int
    #: Starts with ``\A`` or a non-multiline ``^``: no match can start after position 0.
    anchored: bool
    #: Some assertion looks at the character before its position (``\b``, multiline ``^``).
    needs_prev: bool
    memo: dict[tuple[Any, ...], tuple[bool, tuple[int, ...], int]] = attrs.field(
        factory=dict, repr=False
    )

    def search(self, text: str, meter: Meter) -> bool:
        # One position at a time: the states alive before it, the character there and what
        # the assertions can see around it decide the step, so steps are memoized (bounded).
        memo = self.memo
        needs_prev = self.needs_prev
        current: tuple[int, ...] = ()
        end = len(text)
        for position in range(end + 1):
            key = (
                current,
                text[position] if position < end else None,
                text[position - 1] if needs_prev and position else None,
                position == 0,
                min(end - position, 2),
            )
            found = memo.get(key)
            if found is None:
                found = self.step(text, position, current)
                if len(memo) >= _MEMO_SIZE:
                    memo.clear()
                memo[key] = found
            matched, current, steps = found
            meter.spend(steps)
            if matched:
                return True
            if position == end or (not current and self.anchored):
                return False
        return False

    def step(
        self, text: str, position: int, current: tuple[int, ...]
    ) -> tuple[bool, tuple[int, ...], int]:
        """``(matched, the states after the character at position, steps taken)``."""
        kinds, tests, out1, out2 = self.kinds, self.tests, self.out1, self.out2
        # Every state reachable without consuming a character (a match may start here too).
        stack = [*current, self.start]
        seen: set[int] = set()
        consuming = []
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            kind = kinds[node]
            if kind == _CHAR:
                consuming.append(node)
            elif kind == _SPLIT:
                stack.append(out2[node])
                stack.append(out1[node])
            elif kind == _ASSERT:
                if tests[node].match(text, position) is not None:
                    stack.append(out1[node])
            else:
                return True, (), len(seen)
        steps = len(seen) + len(consuming)
        if position == len(text):
            return False, (), steps
        after = tuple(out1[node] for node in consuming if tests[node].match(text, position))
        return False, after, steps


@attrs.define
class _Builder:
    pattern: str
    kinds: list[int] = attrs.Factory(list)
    tests: list[Any] = attrs.Factory(list)
    out1: list[int] = attrs.Factory(list)
    out2: list[int] = attrs.Factory(list)
    compiled: dict[tuple[Any, ...], Any] = attrs.Factory(dict)
    needs_prev: bool = False

    def add(self, kind: int, test: Any, out1: int, out2: int = -1) -> int:
        if len(self.kinds) >= MAX_STATES:
            raise PatternError(
                f"pattern {self.pattern!r} needs more than {MAX_STATES} states (a large bounded"
                " repeat such as {1,5000}?); use a smaller bound, or maxLength with a simpler"
                " pattern"
            )
        self.kinds.append(kind)
        self.tests.append(test)
        self.out1.append(out1)
        self.out2.append(out2)
        return len(self.kinds) - 1

    def test(self, op: Any, av: Any, flags: int) -> Any:
        """``re``'s own compiled form of one character test or assertion."""
        key = (op, repr(av), flags)
        found = self.compiled.get(key)
        if found is None:
            state = _sre_parser.State()
            state.flags = flags
            found = self.compiled[key] = _sre_compiler.compile(
                _sre_parser.SubPattern(state, [(op, av)]), 0
            )
        return found

    def sequence(self, items: Any, flags: int, after: int) -> int:
        for op, av in reversed(list(items)):
            after = self.item(op, av, flags, after)
        return after

    def item(self, op: Any, av: Any, flags: int, after: int) -> int:
        if op in _ONE_CHAR:
            return self.add(_CHAR, self.test(op, av, flags), after)
        if op is _sre.AT:
            if av in (_sre.AT_BOUNDARY, _sre.AT_NON_BOUNDARY) or flags & re.MULTILINE:
                self.needs_prev = True
            return self.add(_ASSERT, self.test(op, av, flags), after)
        if op is _sre.BRANCH:
            starts = [self.sequence(branch, flags, after) for branch in av[1]]
            node = starts[-1]
            for start in reversed(starts[:-1]):
                node = self.add(_SPLIT, None, start, node)
            return node
        if op is _sre.SUBPATTERN:
            _group, add_flags, del_flags, body = av
            return self.sequence(body, (flags | add_flags) & ~del_flags, after)
        if op in _REPEATS:
            low, high, body = av
            if high == _sre.MAXREPEAT:
                loop = self.add(_SPLIT, None, -1, after)
                self.out1[loop] = self.sequence(body, flags, loop)
                node = loop
            else:
                node = after
                for _ in range(high - low):
                    node = self.add(_SPLIT, None, self.sequence(body, flags, node), after)
            for _ in range(low):
                node = self.sequence(body, flags, node)
            return node
        what = _BACKTRACKING.get(op, f"the construct {op}")
        raise PatternError(
            f"pattern {self.pattern!r} uses {what}, which needs a backtracking matcher (and can"
            " take exponential time); express it without (for several conditions on one"
            " string, use allOf with one pattern each)"
        )


def compile_pattern(pattern: str) -> LinearPattern:
    """Compile ``pattern`` (Python ``re`` syntax, as jsonschema reads it).

    Raises:
        PatternError: it is not a valid regular expression, or needs backtracking.
    """
    try:
        parsed = _sre_parser.parse(pattern)
    except re.error as exc:
        raise PatternError(f"pattern {pattern!r} is not a valid regular expression: {exc}")
    builder = _Builder(pattern)
    accept = builder.add(_MATCH, None, -1)
    flags = parsed.state.flags
    start = builder.sequence(parsed, flags, accept)
    first = parsed.data[0] if parsed.data else None
    anchored = first == (_sre.AT, _sre.AT_BEGINNING_STRING) or (
        first == (_sre.AT, _sre.AT_BEGINNING) and not flags & re.MULTILINE
    )
    return LinearPattern(
        pattern,
        tuple(builder.kinds),
        tuple(builder.tests),
        tuple(builder.out1),
        tuple(builder.out2),
        start,
        anchored,
        builder.needs_prev,
    )


def keywords(compiled: dict[str, LinearPattern], default_steps: int) -> dict[str, Any]:
    """jsonschema keyword functions that match with ``compiled`` (a tool's patterns) instead
    of ``re.search``: ``pattern``, ``patternProperties`` and ``additionalProperties`` (which
    consults ``patternProperties``); otherwise as jsonschema 4 writes them."""

    def search(pattern: str, text: str) -> bool:
        linear = compiled.get(pattern)
        if linear is None:  # reached through a $ref to a schema the tool does not hold
            linear = compile_pattern(pattern)
        meter = METER.get(None)
        return linear.search(text, meter if meter is not None else Meter(default_steps))

    def pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[Any]:
        if validator.is_type(instance, "string") and not search(patrn, instance):
            yield ValidationError(f"{instance!r} does not match {patrn!r}")

    def pattern_properties(
        validator: Any, pattern_properties: Any, instance: Any, schema: Any
    ) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        for patrn, subschema in pattern_properties.items():
            for key, value in instance.items():
                if search(patrn, key):
                    yield from validator.descend(value, subschema, path=key, schema_path=patrn)

    def additional_properties(validator: Any, ap: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        properties = schema.get("properties", {})
        patterns = list(schema.get("patternProperties", {}))
        extras = {
            key
            for key in instance
            if key not in properties and not any(search(p, key) for p in patterns)
        }
        if validator.is_type(ap, "object"):
            for extra in extras:
                yield from validator.descend(instance[extra], ap, path=extra)
        elif not ap and extras:
            if patterns:
                verb = "does" if len(extras) == 1 else "do"
                joined = ", ".join(repr(each) for each in sorted(extras))
                listed = ", ".join(repr(each) for each in sorted(patterns))
                yield ValidationError(f"{joined} {verb} not match any of the regexes: {listed}")
            else:
                names = ", ".join(repr(each) for each in sorted(extras, key=str))
                verb = "was" if len(extras) == 1 else "were"
                yield ValidationError(
                    f"Additional properties are not allowed ({names} {verb} unexpected)"
                )

    return {
        "pattern": pattern,
        "patternProperties": pattern_properties,
        "additionalProperties": additional_properties,
    }


_DATA_KEYWORDS = frozenset(("const", "enum", "default", "examples"))


def schema_patterns(schema: Any) -> Iterator[str]:
    """Every regular expression ``schema`` holds (``pattern`` values, ``patternProperties``
    keys), skipping the data keywords whose values are instances, not schemas."""
    if isinstance(schema, Mapping):
        for key, value in schema.items():
            if key in _DATA_KEYWORDS:
                continue
            if key == "pattern" and isinstance(value, str):
                yield value
            elif key == "patternProperties" and isinstance(value, Mapping):
                yield from (name for name in value if isinstance(name, str))
            yield from schema_patterns(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from schema_patterns(value)

"""Reports through logging as OTP's logger makes them: structured fields on the record,
formatting only where a handler writes, a burst limit that drops past 500 a second and says
how many it dropped, and tracebacks rendered as ``traceback`` renders them."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio

import otp
from supervisors import ChildSpec, Supervisor, SupFlags

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class Keeper(logging.Handler):
    """Keeps the records it is given and never formats them (a handler that never emits)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class Loud(Exception):
    """Counts how often its text is asked for: a formatted message or traceback asks."""

    rendered = 0

    def __str__(self) -> str:
        Loud.rendered += 1
        return "loud"


class Crashy(otp.GenServer):
    async def init(self) -> Any:
        return otp.Ok(None)

    async def handle_call(self, request: Any, from_: otp.From, state: Any) -> Any:
        return otp.Reply(request, state)

    async def handle_cast(self, request: Any, state: Any) -> Any:
        raise Loud()


@contextmanager
def _keeping(*names: str) -> Iterator[Keeper]:
    """``Keeper`` as the only handler of ``names`` (entered in the test's body: pytest adds
    its own handler, which formats, to loggers that do not propagate when a test starts)."""
    keeper = Keeper()
    loggers = [logging.getLogger(name) for name in names]
    saved = [(lg.level, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.addHandler(keeper)
        lg.setLevel(logging.INFO)
        lg.propagate = False  # the only handler: pytest's own would format the records
    try:
        yield keeper
    finally:
        for lg, (level, propagate) in zip(loggers, saved, strict=True):
            lg.removeHandler(keeper)
            lg.setLevel(level)
            lg.propagate = propagate


async def _crash_once() -> tuple[otp.Pid, otp.Pid, otp.Pid]:
    """A supervised child raises once and is restarted: (supervisor, old child, new child)."""
    otp.process_flag(trap_exit=True)
    sup = await Supervisor.start_link(SupFlags(), [ChildSpec("c", (Crashy.start_link,))])
    old = (await Supervisor.which_children(sup))[0][1]
    otp.cast(old, "crash")
    while (new := (await Supervisor.which_children(sup))[0][1]) == old or not isinstance(
        new, otp.Pid
    ):
        await trio.sleep(0)
    assert await otp.call(new, "ping") == "ping"
    return sup, old, new


async def test_crash_and_supervisor_reports_reach_a_handler_as_structured_fields() -> None:
    with _keeping("otp.crash", "supervisors") as keeper:
        async with otp.open_node():
            sup, old, new = await _crash_once()
    crash = next(r for r in keeper.records if r.name == "otp.crash")
    report = crash.otp_report  # type: ignore[attr-defined]
    assert report["process"] == old and report["name"] is None
    assert report["behaviour"].endswith("Crashy")
    assert isinstance(report["reason"], otp.Crash)
    assert isinstance(report["reason"].exception, Loud)
    assert report["last_message"] is not None
    assert crash.exc_info is not None and crash.exc_info[1] is report["reason"].exception
    terminated = next(r for r in keeper.records if getattr(r, "otp_report", {}).get("errorContext"))
    fields = terminated.otp_report  # type: ignore[attr-defined]
    assert fields["supervisor"] == sup and fields["errorContext"] == "child_terminated"
    assert fields["reason"] == report["reason"]
    assert fields["offender"] == {"id": "c", "pid": old, "restart": "permanent", "type": "worker"}
    started = [r for r in keeper.records if "started" in getattr(r, "otp_report", {})]
    assert [r.otp_report["started"]["pid"] for r in started] == [old, new]  # type: ignore[attr-defined]


async def test_a_handler_that_never_emits_never_formats_the_report() -> None:
    Loud.rendered = 0
    with _keeping("otp.crash", "supervisors") as keeper:
        async with otp.open_node():
            await _crash_once()
    assert Loud.rendered == 0  # neither the reason's text nor the traceback was made
    crash = next(r for r in keeper.records if r.name == "otp.crash")
    assert crash.exc_text is None
    text = otp.ReportFormatter(TEXT_FORMAT).format(crash)
    assert Loud.rendered > 0
    assert "crashed: {Loud,'loud'}" in text and text.endswith("Loud: loud")


def test_report_formatter_writes_what_logging_formatter_writes() -> None:
    try:
        _recurse(5)
    except RecursionError as exc:
        error = exc
    record = logging.LogRecord(
        "otp.crash", logging.ERROR, __file__, 1, "x %s", ("y",), (RecursionError, error, None)
    )
    record.exc_info = (RecursionError, error, error.__traceback__)
    expected = logging.Formatter(TEXT_FORMAT).format(record)
    record.exc_text = None
    assert otp.ReportFormatter(TEXT_FORMAT).format(record) == expected
    record.exc_text = None
    assert otp.ReportFormatter(TEXT_FORMAT).format(record) == expected  # from the frame cache


def _recurse(n: int) -> None:
    if n == 0:
        raise RecursionError("bottom")
    _recurse(n - 1)


def _raised(make: Any) -> BaseException:
    try:
        make()
    except BaseException as exc:
        return exc
    raise AssertionError("did not raise")


def _chained() -> None:
    try:
        _recurse(0)
    except RecursionError as exc:
        raise KeyError("chained") from exc


def _context() -> None:
    try:
        _recurse(0)
    except RecursionError:
        raise KeyError("during") from None


def _noted() -> None:
    error = ValueError("with notes")
    error.add_note("first\nsecond")
    raise error


def _group() -> None:
    raise ExceptionGroup("two", [ValueError(1), TypeError(2)])


def _syntax() -> None:
    compile("1 +", "<input>", "exec")


@pytest.mark.parametrize(
    "make",
    [
        lambda: _recurse(0),
        lambda: _recurse(12),  # "[Previous line repeated ...]"
        _chained,
        _context,
        _noted,
        _group,
        _syntax,
        lambda: {}["missing"],
    ],
)
def test_format_exception_renders_what_traceback_renders(make: Any) -> None:
    error = _raised(make)
    expected = "".join(traceback.format_exception(error))
    assert otp.format_exception(error) == expected
    assert otp.format_exception(error) == expected  # again, from the frame cache


def test_format_exception_of_an_exception_never_raised() -> None:
    assert otp.format_exception(ValueError("x")) == "ValueError: x\n"


# -- burst limit --------------------------------------------------------------------------


def _limited(max_count: int, window: float) -> tuple[logging.Logger, Keeper, otp.BurstLimit]:
    keeper = Keeper()
    limit = otp.BurstLimit(keeper, max_count=max_count, window=window, clock=trio.current_time)
    keeper.addFilter(limit)
    log = logging.getLogger(f"tests.burst.{id(keeper)}")
    log.propagate = False
    log.addHandler(keeper)
    logging.getLogger("otp.logger").addHandler(keeper)
    return log, keeper, limit


def _texts(keeper: Keeper) -> list[str]:
    return [r.getMessage() for r in keeper.records]


@pytest.fixture
def _no_otp_logger_handlers() -> Iterator[None]:
    logger = logging.getLogger("otp.logger")
    saved = logger.handlers[:]
    yield
    logger.handlers[:] = saved


@pytest.mark.usefixtures("_no_otp_logger_handlers")
async def test_burst_limit_drops_past_max_count_in_a_window(autojump_clock: Any) -> None:
    log, keeper, limit = _limited(3, 1.0)
    for n in range(5):
        log.error("storm %d", n)
        await trio.sleep(0.1)
    assert _texts(keeper) == ["storm 0", "storm 1", "storm 2"]
    assert (limit.dropped, limit.dropped_total) == (2, 2)


@pytest.mark.usefixtures("_no_otp_logger_handlers")
async def test_burst_limit_logs_the_dropped_count_before_the_next_window(
    autojump_clock: Any,
) -> None:
    log, keeper, limit = _limited(2, 1.0)
    for n in range(6):
        log.error("storm %d", n)
    await trio.sleep(0.999)
    log.error("still in the window")
    await trio.sleep(0.001)
    log.error("after")
    assert _texts(keeper) == [
        "storm 0",
        "storm 1",
        "burst limit: dropped 5 log records (more than 2 in 1 s)",
        "after",
    ]
    count = keeper.records[2]
    assert count.name == "otp.logger" and count.levelno == logging.WARNING
    assert count.otp_report == {  # type: ignore[attr-defined]
        "dropped": 5,
        "window_seconds": 1.0,
        "max_count": 2,
    }
    assert (limit.dropped, limit.dropped_total) == (0, 5)


@pytest.mark.usefixtures("_no_otp_logger_handlers")
async def test_flush_dropped_waits_for_the_window_to_end(autojump_clock: Any) -> None:
    log, keeper, limit = _limited(1, 2.0)
    log.error("a")
    log.error("b")
    assert limit.flush_dropped() == 0  # the window still runs
    await trio.sleep(2.0)
    assert limit.flush_dropped() == 1
    assert limit.flush_dropped() == 0
    assert _texts(keeper) == ["a", "burst limit: dropped 1 log records (more than 1 in 2 s)"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_count": 0}, "BurstLimit.max_count must be an int >= 1 (got 0)"),
        ({"max_count": True}, "BurstLimit.max_count must be an int >= 1 (got True)"),
        ({"max_count": 2.5}, "BurstLimit.max_count must be an int >= 1 (got 2.5)"),
        ({"window": 0}, "BurstLimit.window must be a number of seconds > 0 (got 0)"),
        ({"window": -0.5}, "BurstLimit.window must be a number of seconds > 0 (got -0.5)"),
        ({"window": True}, "BurstLimit.window must be a number of seconds > 0 (got True)"),
        ({"window": "1"}, "BurstLimit.window must be a number of seconds > 0 (got '1')"),
    ],
)
def test_burst_limit_rejects_bad_settings(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        otp.BurstLimit(logging.NullHandler(), **kwargs)
    assert str(caught.value) == message


def test_no_record_is_made_when_no_handler_would_take_it() -> None:
    made: list[logging.LogRecord] = []
    factory = logging.getLogRecordFactory()

    def counting(*args: Any, **kwargs: Any) -> logging.LogRecord:
        made.append(factory(*args, **kwargs))
        return made[-1]

    log = logging.getLogger("tests.logger.quiet")
    log.addHandler(logging.NullHandler())
    log.propagate = False
    logging.setLogRecordFactory(counting)
    try:
        otp.log_report(log, logging.ERROR, "nobody %s", ("reads",), {"a": 1})
        assert made == []
        keeper = Keeper()
        keeper.setLevel(logging.CRITICAL)
        log.addHandler(keeper)
        otp.log_report(log, logging.ERROR, "nobody %s", ("reads",), {"a": 1})
        assert made == []  # the only handler is above the level
        keeper.setLevel(logging.NOTSET)
        otp.log_report(log, logging.ERROR, "someone %s", ("reads",), {"a": 1})
        assert [r.getMessage() for r in keeper.records] == ["someone reads"]
        assert keeper.records[0].otp_report == {"a": 1}  # type: ignore[attr-defined]
    finally:
        logging.setLogRecordFactory(factory)
        log.handlers.clear()


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class Blank(Exception):
    def __str__(self) -> str:
        return ""


@pytest.mark.parametrize("error", [Unprintable(), Blank(), Loud(), KeyError("k"), OSError(2, "x")])
def test_format_exception_writes_the_message_line_as_traceback_does(error: BaseException) -> None:
    raised = _raised(lambda: (_ for _ in ()).throw(error))
    assert otp.format_exception(raised) == "".join(traceback.format_exception(raised))


def test_a_report_record_has_the_fields_logging_gives_a_record() -> None:
    log = logging.getLogger("tests.logger.fields")
    keeper = Keeper()
    log.addHandler(keeper)
    log.propagate = False
    try:
        error = _raised(lambda: _recurse(0))
        otp.log_report(log, logging.WARNING, "m %s", ("a",), {"k": 1}, exc_info=error)
    finally:
        log.removeHandler(keeper)
    (made,) = keeper.records
    info = (type(error), error, error.__traceback__)
    expected = log.makeRecord(
        log.name,
        logging.WARNING,
        "(unknown file)",
        0,
        "m %s",
        ("a",),
        info,
        extra={"otp_report": {"k": 1}},
    )
    timing = {"created", "msecs", "relativeCreated"}
    assert {k: v for k, v in vars(made).items() if k not in timing} == {
        k: v for k, v in vars(expected).items() if k not in timing
    }
    assert made.getMessage() == "m a" and made.created <= expected.created

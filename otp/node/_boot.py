"""Booting a node: distribution, applications in order, a banner, and an orderly stop on
SIGINT/SIGTERM (applications in reverse order, each tree in reverse start order)."""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any, TextIO

import trio

import otp
import supervisors

from ._config import ConfigError, NodeConfig, load_object
from ._observer import observer_actions_banner, observer_address, observer_application
from ._observer_agent import observer_agent_application

logger = logging.getLogger("otp.node")

#: Exit code when an application's end stopped the node (Erlang's "Kernel pid terminated").
EXIT_APPLICATION_FAILED = 1
#: Exit code when a second SIGINT stopped the node at once.
EXIT_INTERRUPTED = 130


def resolve_application(path: str, config: NodeConfig) -> supervisors.Application:
    """The :class:`~supervisors.Application` that ``module[:attr]`` names.

    ``attr`` defaults to ``application``. It may be an Application or a callable that takes the
    :class:`NodeConfig` and returns one (so an application can read its settings); a
    ``ValueError`` it raises says its settings are wrong, and becomes a :class:`ConfigError`.
    """
    if ":" not in path:
        path = f"{path}:application"
    obj = load_object(path)
    if not isinstance(obj, supervisors.Application) and callable(obj):
        try:
            obj = obj(config)
        except ValueError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    if not isinstance(obj, supervisors.Application):
        raise ConfigError(
            f"{path} is a {type(obj).__name__}, not a supervisors.Application (or a function"
            " of the NodeConfig returning one)"
        )
    return obj


async def _tree(pid: Any, indent: str, out: list[str]) -> None:
    for child_id, child, kind, _modules in reversed(await supervisors.which_children(pid)):
        if child_id is None:
            child_id = "(dynamic child)"  # OTP's undefined: a DynamicSupervisor's children
        if kind == "supervisor" and isinstance(child, otp.Pid):
            out.append(f"{indent}{child_id} (supervisor) {child!r}")
            await _tree(child, indent + "  ", out)
        else:
            out.append(f"{indent}{child_id} {child!r}")


async def banner(config: NodeConfig, started: list[tuple[supervisors.Application, Any]]) -> str:
    """What the node prints once it runs: where it is and what runs."""
    lines = [f"node {config.name} (OS pid {os.getpid()}) is running"]
    dist = otp.current_node().distribution
    if dist is not None:
        for address in dist.listening:
            lines.append(f"  listening on {address}")
    observer = observer_address()
    if observer is not None:
        lines.append(
            f"  observer on {observer} (/metrics, /healthz, /readyz, /api/snapshot, /api/tree)"
        )
        actions = observer_actions_banner()
        if actions is not None:
            lines.append(f"  {actions}")
    for app, root in started:
        lines.append(f"  application {app.name}: {app.description or ''}".rstrip(": "))
        tree: list[str] = []
        if isinstance(root, otp.Pid):
            await _tree(root, "    ", tree)
        lines.extend(tree)
    lines.append("stop with Ctrl-C or SIGTERM")
    return "\n".join(lines)


async def serve(
    config: NodeConfig,
    applications: list[supervisors.Application],
    *,
    out: TextIO = sys.stdout,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> int:
    """Run a node until a signal or an application's end stops it; returns the exit code.

    With ``config.observer`` set, the ``observer`` application (the HTTP endpoint) starts
    first, so ``/readyz`` answers 503 while the others start, and stops last.

    A signal during the boot cancels it (a start may never end: an init waiting on a database
    that is down), kills the tree of the application being started, and stops the ones started.
    """
    stopping = trio.Event()
    code = 0
    if config.distribution is not None:
        # Remote observers attach to any distributed node (python -m otp.observer).
        applications = [observer_agent_application(), *applications]
    if config.observer is not None:
        expected = tuple(app.name for app in applications)
        applications = [observer_application(config.observer, expected), *applications]

    async def application_ended() -> None:
        nonlocal code
        ended = await supervisors.wait_node_stop()
        print(
            f"application {ended.application} ended ({otp.format_reason(ended.reason)}):"
            " stopping the node",
            file=out,
            flush=True,
        )
        code = EXIT_APPLICATION_FAILED
        stopping.set()

    async with otp.open_node(config.name):
        otp.process_flag(trap_exit=True)
        async with trio.open_nursery() as nursery:
            boot = trio.CancelScope()
            nursery.start_soon(_watch_signals, stopping, boot, out)
            started: list[tuple[supervisors.Application, Any]] = []
            with boot:
                if config.distribution is not None:
                    await _start_distribution(config)
                if not await _start_applications(applications, started, out):
                    nursery.cancel_scope.cancel()
                    return EXIT_APPLICATION_FAILED
            if boot.cancelled_caught:
                _abort_start(applications)
            else:
                print(await banner(config, started), file=out, flush=True)
                task_status.started()
                nursery.start_soon(application_ended)
                await stopping.wait()
            print("stopping: applications in reverse order", file=out, flush=True)
            await supervisors.stop_all_applications()
            print("stopped", file=out, flush=True)
            nursery.cancel_scope.cancel()
    return code


async def _start_applications(
    applications: list[supervisors.Application],
    started: list[tuple[supervisors.Application, Any]],
    out: TextIO,
) -> bool:
    """Start ``applications`` in order, appending each to ``started``; False if one failed to
    start (then the ones started are stopped, in reverse order)."""
    for app in applications:
        try:
            await supervisors.start_application(app, "permanent")
        except supervisors.SupervisorError as exc:
            print(f"application {app.name} failed to start: {exc}", file=out, flush=True)
            await supervisors.stop_all_applications()
            return False
        started.append((app, supervisors.application_supervisor(app.name)))
    return True


def _abort_start(applications: list[supervisors.Application]) -> None:
    """Kill the tree of an application whose start was cancelled but still runs.

    Cancelling ``start_application`` leaves the controller blocked in that start, so it could
    stop nothing; the tree being started is the one process linked to the controller that is
    no running application's root. A start that may never end cannot be asked to stop: it is
    killed, as a supervisor kills a child that overran its shutdown time.
    """
    controller = otp.whereis(supervisors.CONTROLLER_NAME)
    info = None if controller is None else otp.process_info(controller)
    if info is None:
        return
    roots = {supervisors.application_supervisor(app.name) for app in applications}
    for pid in info.links:
        if pid not in roots:
            otp.exit(pid, otp.KILL)


async def _watch_signals(stopping: trio.Event, boot: trio.CancelScope, out: TextIO) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            if not stopping.is_set():
                print(f"{signal.Signals(signum).name}: stopping gracefully", file=out, flush=True)
                stopping.set()
                boot.cancel()
            elif signum == signal.SIGINT:
                print("second SIGINT: stopping at once", file=out, flush=True)
                out.flush()
                os._exit(EXIT_INTERRUPTED)


async def _start_distribution(config: NodeConfig) -> None:
    dist = config.distribution
    assert dist is not None
    try:
        await otp.start_distribution(dist.config)
    except (OSError, otp.DistributionError) as exc:
        listen = " ".join(f"--listen {address}" for address in dist.config.listen)
        raise ConfigError(f"{listen}: cannot listen ({exc})") from exc
    for peer, address in dist.connect:
        if not await otp.connect(peer, address):
            logger.warning("could not connect to %s at %s (will retry on first use)", peer, address)

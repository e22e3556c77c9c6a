"""A pure model of OTP supervision trees, written from OTP_SEMANTICS.md section 5 independently
of the implementation, for the property tests.

A tree is a ``SupDef`` whose children are ``WorkerDef`` or ``SupDef``. The model keeps the log
the real workers and supervisors write (``("start", id)`` in every init, ``("terminate", id,
token)`` in every worker's terminate) and whether each node is running.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

NORMAL_TOKENS = frozenset({"normal", "shutdown", "shutdown_x"})


@dataclass(frozen=True)
class WorkerDef:
    id: str
    restart: str = "permanent"


@dataclass(frozen=True)
class SupDef:
    id: str
    strategy: str = "one_for_one"
    intensity: int = 1
    period: int = 5
    restart: str = "permanent"
    children: tuple[WorkerDef | SupDef, ...] = ()


ChildDef = WorkerDef | SupDef


@dataclass
class MChild:
    defn: ChildDef
    running: bool = False
    sup: MSup | None = None

    @property
    def id(self) -> str:
        return self.defn.id


@dataclass
class MSup:
    defn: SupDef
    log: list[tuple[str, ...]]
    clock: list[float]
    children: list[MChild] = field(default_factory=list)
    restarts: list[int] = field(default_factory=list)
    alive: bool = True

    # -- lifecycle -------------------------------------------------------------------------------

    def boot(self) -> None:
        self.log.append(("start", self.defn.id))
        self.children = [MChild(d) for d in self.defn.children]
        for child in self.children:
            self.start(child)

    def start(self, child: MChild) -> None:
        if isinstance(child.defn, SupDef):
            child.sup = MSup(child.defn, self.log, self.clock)
            child.sup.boot()
        else:
            self.log.append(("start", child.id))
        child.running = True

    def stop(self, child: MChild) -> None:
        if not child.running:
            return
        if child.sup is not None:
            child.sup.stop_all()
            child.sup = None
        else:
            self.log.append(("terminate", child.id, "shutdown"))
        child.running = False

    def stop_all(self) -> None:
        for child in reversed(self.children):
            self.stop(child)
        self.alive = False

    def find(self, child_id: str) -> MChild | None:
        return next((c for c in self.children if c.id == child_id), None)

    # -- restarts --------------------------------------------------------------------------------

    def child_exited(self, child: MChild, token: str) -> str:
        """A child ended with ``token``; returns "ok" or "shutdown" (this supervisor gave up)."""
        child.running = False
        child.sup = None
        restart = child.defn.restart
        if restart == "temporary" or (restart == "transient" and token in NORMAL_TOKENS):
            if restart == "temporary":
                self.children.remove(child)
            return "ok"
        now = math.floor(self.clock[0])
        self.restarts = [now, *[r for r in self.restarts if r >= now - self.defn.period]]
        if len(self.restarts) > self.defn.intensity:
            self.stop_all()
            return "shutdown"
        strategy = self.defn.strategy
        if strategy == "one_for_one":
            affected = [child]
        elif strategy == "one_for_all":
            affected = list(self.children)
        else:
            affected = self.children[self.children.index(child) :]
        for other in reversed(affected):
            if other is not child:
                self.stop(other)
                if other.defn.restart == "temporary":
                    self.children.remove(other)
        for other in affected:
            if other in self.children:
                self.start(other)
        return "ok"

    # -- the child API ---------------------------------------------------------------------------

    def terminate_child(self, child_id: str) -> object:
        child = self.find(child_id)
        if child is None:
            return ("error", "not_found")
        self.stop(child)
        if child.defn.restart == "temporary":
            self.children.remove(child)
        return "ok"

    def restart_child(self, child_id: str) -> object:
        child = self.find(child_id)
        if child is None:
            return ("error", "not_found")
        if child.running:
            return ("error", "running")
        self.start(child)
        return "ok"

    def delete_child(self, child_id: str) -> object:
        child = self.find(child_id)
        if child is None:
            return ("error", "not_found")
        if child.running:
            return ("error", "running")
        self.children.remove(child)
        return "ok"

    def start_child(self, defn: ChildDef) -> object:
        child = self.find(defn.id)
        if child is not None:
            return ("error", "already_started" if child.running else "already_present")
        child = MChild(defn)
        self.children.append(child)
        self.start(child)
        return "ok"

    def rows(self) -> list[tuple[str, bool]]:
        return [(c.id, c.running) for c in reversed(self.children)]


def crash(root: MSup, path: list[str], token: str) -> None:
    """Leaf ``path[-1]`` (under the supervisors ``path[:-1]``) ends with ``token``."""
    chain: list[tuple[MSup, MChild]] = []
    sup = root
    for child_id in path:
        if not sup.alive:
            return
        child = sup.find(child_id)
        if child is None or not child.running:
            return
        chain.append((sup, child))
        if child.sup is not None:
            sup = child.sup
    _leaf_parent, leaf = chain[-1]
    if token != "killed":
        root.log.append(("terminate", leaf.id, token))
    token_up = token
    for parent, child in reversed(chain):
        if parent.child_exited(child, token_up) != "shutdown":
            return
        token_up = "shutdown"

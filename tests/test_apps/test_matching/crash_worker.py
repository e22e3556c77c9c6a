"""A pull worker OS process for the real-process tests: ``python crash_worker.py ADDRESS LOG``.

Its one flow type, ``Crashy``, has a Step that appends its execution id to LOG (so a test can
count how often the handler ran) and then, when the environment says ``CRASHY_MODE=hang``,
prints ``started <execution id>`` and blocks as heavy work does until the process is killed.
It prints ``ready`` once registered (in ``fast`` mode a redispatched Step may run before that,
so only ``hang`` mode prints its starts).
"""

from __future__ import annotations

import os
import sys
import threading
import time

import attrs

from apps.matching import Flow, PullWorkerOptions, Registry, Worker, WorkerOptions, rpc, step

#: Handlers run in threads of their own: ``print`` writes a line's text and its end apart, so two
#: handlers starting at once interleaved theirs ("started Astarted B", then "") without it.
_PRINTING = threading.Lock()


class Crashy(Flow):
    @step
    def work(self, ctx, n):
        with open(sys.argv[2], "a") as log:
            log.write(f"{ctx.execution_id} {ctx.attempt} {os.getpid()}\n")
        if os.environ.get("CRASHY_MODE") == "hang":
            with _PRINTING:
                print(f"started {ctx.execution_id}", flush=True)
            while True:  # heavy work that never ends: the test kills this process
                time.sleep(0.05)
        ctx.state["done_by"] = os.getpid()
        return n * 2

    @step
    def finish(self, ctx, doubled):
        return doubled + 1

    @rpc
    def who(self, ctx):
        return ctx.state.get("done_by")


def main() -> None:
    worker = Worker(
        Registry((Crashy,)),
        None,
        WorkerOptions(
            server_address=sys.argv[1],
            # In hang mode the test kills us once the handlers print that they started:
            # each ACCEPT must have gone by then (the server then records each Step's
            # redispatch as redispatch_lost), so none is held for a quick outcome.
            pull=attrs.evolve(
                PullWorkerOptions(max_concurrent_tasks=4, stop_drain_timeout=1),
                **({"accept_delay": 0} if os.environ.get("CRASHY_MODE") == "hang" else {}),
            ),
        ),
    )
    worker.start_background()
    worker.wait_pull_registered(timeout=30)
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin (or kills us)
    worker.close()


if __name__ == "__main__":
    main()

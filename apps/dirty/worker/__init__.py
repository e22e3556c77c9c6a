"""The dirty worker program (``python -m apps.dirty.worker SPEC_JSON``, run by a worker proxy's
port).

One OS process hosting its DirtyApps, talking GD v1 frames with the pool over a socketpair end
it inherits (``pass_fds``). It runs an asyncio loop (Gunicorn's dirty worker does, so ``async
def`` actions written for Gunicorn work unchanged) and runs sync actions in ``dirty_threads``
threads, so many requests are in flight at once, matched by request id. A reader thread takes
the frames (a wait in ``poll`` for input, then a read: no event-loop round per request; a
REQUEST as every client sends it is decoded in one call, ``wire.request_fields``, with no
payload dict); a sync action that has proved quick (under 1 ms, three times in a row) runs
right there, with no thread hand-off, while fewer than ``dirty_threads`` sync actions run (one
slow inline run sends it back to the threads), and the replies of one read go out in one
send. Heartbeats come from the loop, so a loop blocked by an async action (or a worker stuck
holding the GIL) stops them.

Worker-side protocol (private to the pool): REQUEST in; RESPONSE/ERROR/CHUNK/END out; an END
*in* abandons that request (a streaming generator is closed); a STATUS frame out (id 0) is a
heartbeat, and one with a request's id a notice that the request waits for a thread or has
started in one; a RESPONSE out with id 0 says the apps are loaded. Before it loads its apps the
worker waits for one frame from the node (the node's ``dirty_post_fork`` has run), and while it
loads it says which app (``_loading``). The worker exits when its socket closes or its parent
changes (the node died), after closing its apps; SIGTERM first lets its running calls finish
(a STATUS notice with id 0 tells the node, which routes no more calls to it and closes the
socket once they are answered); it exits at once on SIGQUIT; SIGUSR1 reopens log files; SIGINT
is ignored (the node handles Ctrl-C).

Its parts: ``_main`` (boot: the go-ahead, the apps' load, ``dirty_worker_init``), ``_server``
(:class:`Worker`, the serving loop) and ``_output`` (its socket's writes). The node imports
nothing from here.
"""

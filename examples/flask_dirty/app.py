"""A Flask app that offloads image thumbnails and a small "model" to the dirty pool.

Run the pool (the node) and the web app, each as its own process::

    python -m otp.node --app apps.dirty --dirty-app apps.dirty.examples:ExampleApp \\
        --dirty-workers 2 --dirty-socket /tmp/dirty.sock
    GUNICORN_DIRTY_SOCKET=/tmp/dirty.sock gunicorn -w 2 -b 127.0.0.1:8000 \\
        --chdir examples/flask_dirty app:app

then::

    curl -s -X POST --data-binary @photo.jpg 'http://127.0.0.1:8000/thumbnail?size=128' > t.png
    curl -s -X POST -H 'content-type: application/json' -d '{"text": "a great day"}' \\
        http://127.0.0.1:8000/predict
    curl -s 'http://127.0.0.1:8000/count?n=5'

The web workers never run the heavy work themselves: each request is one round trip to a dirty
worker, which loaded the model once. ``get_dirty_client()`` is one client per process, safe to
share across the web worker's threads.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from flask import Flask, Response, jsonify, request

from apps.dirty import DirtyAppError, DirtyError, DirtyProtocolError, get_dirty_client
from apps.dirty.examples import EXAMPLE_APP

app = Flask(__name__)


@app.get("/")
def index() -> Any:
    """Which dirty worker answers, and whether it can make thumbnails."""
    return jsonify(get_dirty_client().execute(EXAMPLE_APP, "info"))


@app.post("/thumbnail")
def thumbnail() -> Any:
    """The request body (an image) shrunk to fit ``size`` x ``size`` (default 128), as PNG."""
    size = request.args.get("size", default=128, type=int)
    result = get_dirty_client().execute(EXAMPLE_APP, "thumbnail", request.get_data(), size=size)
    return Response(
        result["data"],
        mimetype="image/png",
        headers={"X-Thumbnail-Size": f"{result['width']}x{result['height']}"},
    )


@app.post("/predict")
def predict() -> Any:
    """``{"text": ...}`` -> the sentiment model's ``{"label", "score", "words"}``."""
    body = request.get_json(silent=True) or {}
    text = body.get("text") if isinstance(body, dict) else None
    if not isinstance(text, str):
        return jsonify(error='send JSON {"text": "..."}'), 400
    client = get_dirty_client()
    return jsonify(
        prediction=client.execute(EXAMPLE_APP, "predict", text),
        counts=client.execute(EXAMPLE_APP, "word_count", text, top=3),
    )


@app.get("/count")
def count() -> Any:
    """0 .. n-1, one line each, streamed from the pool as the worker yields them."""
    n = request.args.get("n", default=10, type=int)
    # Sent now, before the response starts: a request the pool cannot take is still a 4xx.
    chunks = get_dirty_client().stream(EXAMPLE_APP, "count", n)

    def lines() -> Iterator[str]:
        for i in chunks:
            yield f"{i}\n"

    return Response(lines(), mimetype="text/plain")


@app.errorhandler(DirtyAppError)
def app_error(exc: DirtyAppError) -> Any:
    """The action failed on bad input (not an image, ...): the client's fault."""
    return jsonify(error=exc.message, action=exc.action), 422


@app.errorhandler(DirtyProtocolError)
def bad_request(exc: DirtyProtocolError) -> Any:
    """The request holds a value the pool's protocol cannot carry (a 30-digit size...)."""
    return jsonify(error=exc.message), 400


@app.errorhandler(DirtyError)
def pool_error(exc: DirtyError) -> Any:
    """The pool is down, busy or timed out: try again later."""
    return jsonify(error=str(exc), type=type(exc).__name__), 503

"""The DirtyApp the embedded default node hosts (``apps.dirty.examples:ExampleApp``).

A small tour of what a dirty app does: a plain call (``echo``, ``upper``), a stream
(``count``, ``words``), a "model" loaded once in ``init()`` (a tiny bag-of-words sentiment
classifier with fixed weights, and a word counter), and image work with Pillow (``thumbnail``),
which is optional: without Pillow the action fails with a DirtyAppError saying how to install
it. Call it from a web worker::

    from apps.dirty import get_dirty_client
    client = get_dirty_client()                      # GUNICORN_DIRTY_SOCKET names the socket
    client.execute(EXAMPLE_APP, "upper", "hi")       # -> "HI"
    client.execute(EXAMPLE_APP, "predict", "a great, lovely day")["label"]   # -> "positive"
    list(client.stream(EXAMPLE_APP, "count", 3))     # -> [0, 1, 2]
"""

from __future__ import annotations

import io
import math
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from ._app import DirtyApp

__all__ = ["EXAMPLE_APP", "ExampleApp", "PillowMissingError"]

#: The spec of the bundled app, as clients name it.
EXAMPLE_APP = "apps.dirty.examples:ExampleApp"

_WORD = re.compile(r"[a-z']+")

#: The "trained" weights of the sentiment model: a word's contribution to the logit.
_WEIGHTS = {
    "good": 1.5, "great": 2.0, "excellent": 2.5, "lovely": 1.8, "happy": 1.6, "love": 2.0,
    "fast": 0.8, "nice": 1.2, "best": 1.9, "fine": 0.5, "wonderful": 2.2, "like": 0.7,
    "bad": -1.5, "awful": -2.4, "terrible": -2.5, "slow": -0.9, "sad": -1.6, "hate": -2.2,
    "worst": -2.3, "broken": -1.7, "poor": -1.4, "boring": -1.2, "ugly": -1.5, "not": -0.6,
}  # fmt: skip
_BIAS = 0.1


class PillowMissingError(RuntimeError):
    """The thumbnail action needs Pillow, which is not installed in the worker's environment."""


def _tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class ExampleApp(DirtyApp):
    """The bundled example: echo, streams, a tiny deterministic model, thumbnails."""

    stashes = ("examples",)

    def init(self) -> None:
        """Load the "model" once per worker (here: copy the weights; a real app loads a file)."""
        self.weights = dict(_WEIGHTS)
        self.bias = _BIAS
        self.loaded_at = time.time()

    # Plain calls.

    def echo(self, value: Any) -> Any:
        """Return ``value`` unchanged."""
        return value

    def upper(self, text: str) -> str:
        """``text`` in upper case."""
        return text.upper()

    def info(self) -> dict[str, Any]:
        """Which worker answered, and whether Pillow is available there."""
        return {"pid": os.getpid(), "pillow": _pillow() is not None, "app": EXAMPLE_APP}

    # Streams.

    def count(self, n: int) -> Iterator[int]:
        """Stream 0 .. n-1."""
        yield from range(n)

    def words(self, text: str) -> Iterator[str]:
        """Stream the words of ``text``, one chunk each."""
        yield from text.split()

    # The "model".

    def word_count(self, text: str, top: int = 10) -> dict[str, Any]:
        """The ``top`` most frequent words of ``text`` and the total, deterministically ordered
        (by count, then alphabetically)."""
        if type(top) is not int or top < 0:
            raise ValueError(f"top must be an int >= 0 (got {top!r})")
        counts = Counter(_tokens(text))
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        return {"total": sum(counts.values()), "top": [[w, c] for w, c in ranked]}

    def predict(self, text: str) -> dict[str, Any]:
        """Classify ``text`` as positive or negative: a logistic model over word weights.

        Returns ``{"label": "positive"|"negative", "score": p(positive), "words": [...]}``
        where ``words`` lists the words that moved the score.
        """
        tokens = _tokens(text)
        logit = self.bias + sum(self.weights.get(t, 0.0) for t in tokens)
        score = 1.0 / (1.0 + math.exp(-logit))
        return {
            "label": "positive" if score >= 0.5 else "negative",
            "score": round(score, 6),
            "words": [t for t in tokens if t in self.weights],
        }

    # Images.

    def thumbnail(self, image: bytes, size: int = 128, format: str = "PNG") -> dict[str, Any]:
        """Shrink ``image`` (any format Pillow reads) to fit ``size`` x ``size``, keeping its
        aspect ratio; returns ``{"width", "height", "format", "data"}``.

        Raises:
            PillowMissingError: Pillow is not installed (``pip install pillow``).
            ValueError: ``size`` is not a positive int, or ``image`` is not an image.
        """
        pil = _pillow()
        if pil is None:
            raise PillowMissingError(
                "the thumbnail action needs Pillow, which is not installed where the dirty"
                " workers run: pip install 'pillow>=10' and restart the node (or send it HUP)"
            )
        if type(size) is not int or size < 1:
            raise ValueError(f"size must be an int >= 1 (got {size!r})")
        try:
            img = pil.open(io.BytesIO(image))
            img.load()
        except Exception as exc:
            raise ValueError(f"not an image Pillow can read ({len(image)} bytes): {exc}") from exc
        img.thumbnail((size, size))
        fmt = {"JPG": "JPEG"}.get(format.upper(), format.upper())  # (Pillow knows only JPEG)
        if fmt == "JPEG" and img.mode not in ("RGB", "L"):
            img = img.convert("RGB")
        out = io.BytesIO()
        img.save(out, format=fmt)
        return {"width": img.width, "height": img.height, "format": fmt,
                "data": out.getvalue()}  # fmt: skip


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:
        return None
    return Image

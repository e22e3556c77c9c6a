"""``python -m wire``: decode frames to JSON lines, or encode JSON lines to frames.

    python -m wire decode [--hex] [--version 1|2] < frames.bin
    python -m wire encode [--hex] < frames.jsonl

The debugging tool for anyone sniffing a socket: one JSON object per frame, in the mapping of
``wire/SPEC.md`` (bytes as base64, every non-JSON type as a ``$``-tagged object).
"""

from __future__ import annotations

import argparse
import binascii
import json
import sys
from collections.abc import Iterable, Sequence
from typing import BinaryIO, TextIO

from ._errors import WireError
from ._frame import FrameDecoder, encode_frame
from ._json import frame_from_json, frame_to_json


def _decode(source: BinaryIO, out: TextIO, *, hex_input: bool, versions: frozenset[int]) -> None:
    decoder = FrameDecoder(versions=versions)
    if hex_input:
        text = source.read().decode("ascii", errors="replace")
        try:
            data = bytes.fromhex("".join(text.split()))
        except ValueError as exc:
            raise WireError(f"--hex input is not hexadecimal: {exc}") from None
        chunks: Iterable[bytes] = [data]
    else:
        read = getattr(source, "read1", source.read)
        chunks = iter(lambda: read(65536), b"")
    for chunk in chunks:
        for frame in decoder.feed(chunk):
            out.write(json.dumps(frame_to_json(frame), ensure_ascii=False) + "\n")
            out.flush()
    decoder.feed_eof()


def _encode(source: TextIO, out: BinaryIO, *, hex_output: bool) -> None:
    for number, line in enumerate(source, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WireError(f"line {number} is not JSON: {exc}") from None
        try:
            data = encode_frame(frame_from_json(obj))
        except WireError as exc:
            raise type(exc)(f"line {number}: {exc.message}", exc.offset) from None
        out.write(data.hex().encode("ascii") + b"\n" if hex_output else data)
        out.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (0 ok, 1 bad input, 2 bad usage)."""
    parser = argparse.ArgumentParser(
        prog="python -m wire", description="Decode or encode wire (Gunicorn dirty protocol) frames."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    decode = commands.add_parser("decode", help="frames on stdin -> one JSON line per frame")
    decode.add_argument("--hex", action="store_true", help="stdin is hex text (spaces ignored)")
    decode.add_argument(
        "--version", type=int, choices=(1, 2), help="accept only this protocol version"
    )
    encode = commands.add_parser("encode", help="JSON lines on stdin -> frames on stdout")
    encode.add_argument("--hex", action="store_true", help="write one hex line per frame")
    args = parser.parse_args(argv)
    try:
        if args.command == "decode":
            versions = frozenset({args.version}) if args.version else frozenset({1, 2})
            _decode(sys.stdin.buffer, sys.stdout, hex_input=args.hex, versions=versions)
        else:
            _encode(sys.stdin, sys.stdout.buffer, hex_output=args.hex)
    except WireError as exc:
        print(f"python -m wire {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except binascii.Error as exc:  # pragma: no cover - defensive
        print(f"python -m wire {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

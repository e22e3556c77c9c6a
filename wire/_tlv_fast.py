"""The optimistic fast paths of the TLV codec (:mod:`wire._tlv`): recursive, one Python frame a
container, the common types handled inline in the loops over a container's items.

Neither path reports errors. Each one returns exactly what the exact loops of ``wire._tlv`` would,
or raises (anything: :class:`Fallback`, ``IndexError``, ``struct.error``, ``UnicodeError``,
``TypeError``, ``RecursionError``...), and the caller then runs the exact loop, which produces the
same value or the precise :class:`~wire.WireError` with its offset. So a malformed payload costs a
failed fast attempt plus the exact decode; a valid one costs only the fast path.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from ._limits import FAST_PIECE_BYTES, NO_PIECE
from ._values import MAX_NAME_BYTES, Atom, ErrorValue, ExitReason, Pid, Ref

__all__ = ["HEADS", "SMALL_INTS", "Fallback", "decoder", "encoder"]


class Fallback(Exception):
    """Raised inside a fast path to hand the work to the exact loop; never escapes ``wire``."""


# ---------------------------------------------------------------------------------------------
# Values built from fields a decoder has already checked (no attrs validators run). Member
# descriptors are the cheapest way to fill the slots of a frozen attrs class.


def _setters(cls: type, *names: str) -> tuple[Callable[[object, object], None], ...]:
    return tuple(cls.__dict__[name].__set__ for name in names)


_ATOM_NAME = _setters(Atom, "name")[0]
_PID_NODE, _PID_ID, _PID_CREATION = _setters(Pid, "node", "id", "creation")
_REF_NODE, _REF_ID, _REF_CREATION = _setters(Ref, "node", "id", "creation")
_new = object.__new__


def _atom(name: str) -> Atom:
    atom = _new(Atom)
    _ATOM_NAME(atom, name)
    return atom


def _pid(node: str, ident: int, creation: int) -> Pid:
    pid = _new(Pid)
    _PID_NODE(pid, node)
    _PID_ID(pid, ident)
    _PID_CREATION(pid, creation)
    return pid


def _ref(node: str, ident: int, creation: int) -> Ref:
    ref = _new(Ref)
    _REF_NODE(ref, node)
    _REF_ID(ref, ident)
    _REF_CREATION(ref, creation)
    return ref


# ---------------------------------------------------------------------------------------------
# Decoding
#
# No bounds checks: reading a field past the end raises (IndexError, struct.error), and slicing a
# str or bytes past it yields what exists, after which the end offset lies beyond the payload's
# end, which the caller refuses. Offsets only grow and every item consumes at least one byte, so
# the work and the memory are bounded by the payload's size whatever its headers claim (a huge
# count runs out of bytes, a huge length slices what exists).
#
# Limits: the caller uses this path only when the payload is no longer than max_total_items and
# max_str, which then bound the total and every length by themselves (every item takes at least a
# byte). Counts are checked against max_items as each container starts (before anything is
# built for it), names against MAX_NAME_BYTES, and depth through ``left``, the container levels
# still allowed. Big ints (0x07) are left to the exact loop.

_HDR = struct.Struct(">BI").unpack_from
_U32 = struct.Struct(">I").unpack_from
_I64 = struct.Struct(">q").unpack_from
_F64 = struct.Struct(">d").unpack_from
_IDS = struct.Struct(">QI").unpack_from
# A dict entry whose key is a str of n < 256 bytes, read in one call: the key's type byte and the
# three high bytes of its length as one u32 (0x11000000 for such a key), the key, then the
# value's type byte and the u32 after it (a length or a count for the types that have one). The
# caller takes n from the key header's last byte.
_ENTRY = tuple(struct.Struct(f">Ix{n}sBI").unpack_from for n in range(256))
_SHORT_STR_KEY = 0x11000000

Decode = Callable[[bytes, int, int], tuple[Any, int]]
DecodeDict = Callable[[bytes, int, int, int], tuple[dict[Any, Any], int]]


def decoder(v2: bool, max_items: int) -> tuple[Decode, DecodeDict]:
    """The fast decoder of TLV version 2 (or 1): ``decode(data, off, left) -> (value, end)``,
    and the one of the dicts it decodes, ``decode_dict(data, off, n, left)``, which starts past
    the header (``n`` pairs) and which a caller can use for a payload that is a dict.

    ``left`` is the number of nesting levels allowed (``max_depth``; the dict of ``decode_dict``
    takes one). ``end`` may lie past the end of ``data``: the value was cut short.
    """
    u32, i64, f64, hdr, entry, ids = _U32, _I64, _F64, _HDR, _ENTRY, _IDS
    short_str_key = _SHORT_STR_KEY

    def value(data: bytes, off: int, left: int) -> tuple[Any, int]:
        """Any value. The loops below inline the common ones and call this for the rest, so the
        version 2 types come first here."""
        t = data[off]
        if v2:
            if t == 0x30 or t == 0x31 or t == 0x12:
                n = u32(data, off + 1)[0]
                if n > MAX_NAME_BYTES:
                    raise Fallback
                s = off + 5
                off = s + n
                name = data[s:off].decode()
                if t == 0x12:
                    return _atom(name), off
                ident, creation = ids(data, off)
                return (_pid if t == 0x30 else _ref)(name, ident, creation), off + 12
            if t == 0x22:
                if left:
                    items, off = list_(data, off + 5, u32(data, off + 1)[0], left - 1)
                    return tuple(items), off
                raise Fallback
            if t == 0x32 or t == 0x33:
                if not left:
                    raise Fallback
                left -= 1
                fields = []
                off += 1
                for _ in range(2 if t == 0x32 else 4):
                    field, off = value(data, off, left)
                    fields.append(field)
                # The constructors check the fields as the exact loop does (a WireError here
                # falls back to it, which reports it at the right offset).
                return (ExitReason if t == 0x32 else ErrorValue)(*fields), off
        if t == 0x11:
            s = off + 5
            off = s + u32(data, off + 1)[0]
            return data[s:off].decode(), off
        if t == 0x05:
            return i64(data, off + 1)[0], off + 9
        if t == 0x21:
            if left:
                return dict_(data, off + 5, u32(data, off + 1)[0], left - 1)
            raise Fallback
        if t == 0x20:
            if left:
                return list_(data, off + 5, u32(data, off + 1)[0], left - 1)
            raise Fallback
        if t == 0x00:
            return None, off + 1
        if t == 0x01:
            b = data[off + 1]
            if b == 1:
                return True, off + 2
            if b == 0:
                return False, off + 2
            raise Fallback
        if t == 0x06:
            return f64(data, off + 1)[0], off + 9
        if t == 0x10:
            s = off + 5
            off = s + u32(data, off + 1)[0]
            return data[s:off], off
        raise Fallback  # a big int, an unknown type code, or a version 2 one in version 1

    def list_(data: bytes, off: int, n: int, left: int) -> tuple[list[Any], int]:
        if n > max_items:
            raise Fallback
        items: list[Any] = []
        append = items.append
        v: Any
        # A counting loop costs less than iterating over a range in CPython 3.11; written so that
        # it ends in JUMP_BACKWARD, which lets the interpreter specialise the function even when
        # it is called only a few times (on one large payload).
        while True:
            if not n:
                break
            n -= 1
            t = data[off]
            if t == 0x11:
                s = off + 5
                off = s + u32(data, off + 1)[0]
                append(data[s:off].decode())
            elif t == 0x05:
                append(i64(data, off + 1)[0])
                off += 9
            elif t == 0x21 and left:
                v, off = dict_(data, off + 5, u32(data, off + 1)[0], left - 1)
                append(v)
            elif t == 0x20 and left:
                v, off = list_(data, off + 5, u32(data, off + 1)[0], left - 1)
                append(v)
            elif t == 0x00:
                append(None)
                off += 1
            elif t == 0x06:
                append(f64(data, off + 1)[0])
                off += 9
            elif t == 0x01:
                b = data[off + 1]
                if b > 1:
                    raise Fallback
                append(b == 1)
                off += 2
            elif t == 0x10:
                s = off + 5
                off = s + u32(data, off + 1)[0]
                append(data[s:off])
            else:
                v, off = value(data, off, left)
                append(v)
        return items, off

    def dict_(data: bytes, off: int, n: int, left: int) -> tuple[dict[Any, Any], int]:
        if n > max_items:
            raise Fallback
        result: dict[Any, Any] = {}
        v: Any
        count = n
        while True:  # (as in list_)
            if not n:
                break
            n -= 1
            try:
                k = data[off + 4]
                tag, raw, vt, vn = entry[k](data, off)
            except (IndexError, struct.error):  # too near the end to read all that
                tag = -1
            if tag == short_str_key:
                key: Any = raw.decode()
                off += k + 10
            else:  # a longer key, one that is not a str, or one near the end
                if data[off] == 0x11:
                    s = off + 5
                    off = s + u32(data, off + 1)[0]
                    key = data[s:off].decode()
                elif v2:
                    key, off = value(data, off, left)
                    if type(key) is float and key != key:
                        raise Fallback  # a NaN: the exact loop checks for another of its bits
                else:
                    raise Fallback  # version 1 keys are str
                try:
                    vt, vn = hdr(data, off)
                except struct.error:  # a value of under 5 bytes at the very end
                    vt = -1  # (value() below decodes it)
                off += 5
            # off is now 5 bytes past the value's start, vt its type byte, vn the u32 after it.
            if vt == 0x11:
                s = off
                off += vn
                result[key] = data[s:off].decode()
            elif vt == 0x05:
                result[key] = i64(data, off - 4)[0]
                off += 4
            elif vt == 0x21 and left:
                result[key], off = dict_(data, off, vn, left - 1)
            elif vt == 0x20 and left:
                # A list: decoded here, without calling list_ (lists of scalars are the most
                # common leaves); its items are one level down.
                if vn > max_items:
                    raise Fallback
                items: list[Any] = []
                add = items.append
                inner = left - 1
                while True:
                    if not vn:
                        break
                    vn -= 1
                    t = data[off]
                    if t == 0x11:
                        s = off + 5
                        off = s + u32(data, off + 1)[0]
                        add(data[s:off].decode())
                    elif t == 0x05:
                        add(i64(data, off + 1)[0])
                        off += 9
                    elif t == 0x00:
                        add(None)
                        off += 1
                    elif t == 0x06:
                        add(f64(data, off + 1)[0])
                        off += 9
                    elif t == 0x01:
                        b = data[off + 1]
                        if b > 1:
                            raise Fallback
                        add(b == 1)
                        off += 2
                    elif t == 0x10:
                        s = off + 5
                        off = s + u32(data, off + 1)[0]
                        add(data[s:off])
                    elif t == 0x21 and inner:
                        v, off = dict_(data, off + 5, u32(data, off + 1)[0], inner - 1)
                        add(v)
                    elif t == 0x20 and inner:
                        v, off = list_(data, off + 5, u32(data, off + 1)[0], inner - 1)
                        add(v)
                    else:
                        v, off = value(data, off, inner)
                        add(v)
                result[key] = items
            elif vt == 0x00:
                result[key] = None
                off -= 4
            elif vt == 0x06:
                result[key] = f64(data, off - 4)[0]
                off += 4
            elif vt == 0x01:
                b = vn >> 24  # the byte after the type byte
                if b > 1:
                    raise Fallback
                result[key] = b == 1
                off -= 3
            elif vt == 0x10:
                s = off
                off += vn
                result[key] = data[s:off]
            else:
                result[key], off = value(data, off - 5, left)
        if len(result) != count:
            raise Fallback  # a duplicate key
        return result, off

    return value, dict_


# ---------------------------------------------------------------------------------------------
# Encoding
#
# The encoder appends the pieces of the encoding to a list, joined once at the end. It takes the
# exact built-in types only (a subclass such as IntEnum, an int outside int64, or any type it
# does not know makes it give up), and checks the limits as the exact loop does: depth through
# ``left``, max_items where a container's header is written, max_str on every str and bytes it
# encodes, and max_total_items from above: every value adds at least one piece, so the number of
# pieces bounds the number of values; it is checked as each container starts, counting the
# container's items (which also bounds the work on a value that shares one list many times over),
# and by the caller at the end. The caller passes a max_total lowered to FAST_MAX_PARTS, and
# long strs and bytes add empty pieces, so that the pieces' count also bounds their bytes
# (wire._limits).

_PACK_HDR = struct.Struct(">BI").pack
_PACK_INT = struct.Struct(">Bq").pack
_PACK_FLOAT = struct.Struct(">Bd").pack
_PACK_IDS = struct.Struct(">QI").pack
#: The encodings of the ints 0..255, and the headers of lists, dicts and tuples of 0..255 items.
SMALL_INTS = tuple(_PACK_INT(0x05, n) for n in range(256))
HEADS = {code: tuple(_PACK_HDR(code, n) for n in range(256)) for code in (0x20, 0x21, 0x22)}

Encode = Callable[[Any, list[bytes], int], None]


def encoder(
    v2: bool,
    max_items: int,
    max_total: int,
    max_str: int,
    cache: dict[str, bytes],
    cache_str: Callable[[str, list[bytes]], bytes],
) -> tuple[Encode, Encode]:
    """The fast encoder of TLV version 2 (or 1) under the given limits:
    ``encode(value, parts, left)`` appends the encoding of ``value`` to ``parts``, and
    ``encode_dict`` the same for a value known to be a ``dict`` (which takes one level of
    ``left`` from the caller's).

    ``cache`` maps short strs to their encoding and ``cache_str`` encodes a str (checking
    ``max_str``), adding it to the cache when it is short, or the pieces of FAST_PIECE_BYTES it
    counts for when it is long (see :func:`large`); the caller passes an empty cache when
    ``max_str`` is too small for the cached encodings.
    """
    # Everything the loops use is a local of this function (a cell to them), not a global.
    get = cache.get
    small = SMALL_INTS
    list_heads, dict_heads, tuple_heads = HEADS[0x20], HEADS[0x21], HEADS[0x22]
    # Containers of fewer items than this take their header from the tables (so they are within
    # max_items); longer ones go through head(), which checks.
    short = min(256, max_items + 1)
    hdr, pack_int, pack_float, pack_ids = _PACK_HDR, _PACK_INT, _PACK_FLOAT, _PACK_IDS
    str_, int_, float_, bytes_, bool_ = str, int, float, bytes, bool
    list_t, dict_t, tuple_t, len_ = list, dict, tuple, len

    def head(code: int, n: int) -> bytes:
        if n > max_items:
            raise Fallback
        return hdr(code, n)

    piece = min(max_str, FAST_PIECE_BYTES)

    def large(x: bytes, parts: list[bytes]) -> None:
        """Bytes longer than a piece, with the empty pieces they count for (wire._limits)."""
        n = len_(x)
        if n > max_str:
            raise Fallback
        parts.append(hdr(0x10, n))
        parts.append(x)
        parts += NO_PIECE * (n // FAST_PIECE_BYTES)
        if len_(parts) > max_total:
            raise Fallback

    def item(x: Any, parts: list[bytes], left: int) -> None:
        """Any value. The loops below inline the common ones and call this for the rest, so the
        version 2 types come first here."""
        append = parts.append
        t = type(x)
        if v2:
            if t is Pid or t is Ref:
                b = x.node.encode()
                append(hdr(0x30 if t is Pid else 0x31, len_(b)))
                append(b)
                append(pack_ids(x.id, x.creation))
                return
            if t is tuple_t and left:
                list_(x, parts, left - 1, tuple_heads)
                return
            if t is Atom:
                b = x.name.encode()
                append(hdr(0x12, len_(b)))
                append(b)
                return
            if (t is ExitReason or t is ErrorValue) and left:
                if len_(parts) > max_total:
                    raise Fallback
                left -= 1
                if t is ExitReason:
                    append(b"\x32")
                    item(x.kind, parts, left)
                    item(x.detail, parts, left)
                else:
                    append(b"\x33")
                    item(x.type, parts, left)
                    item(x.message, parts, left)
                    item(x.details, parts, left)
                    item(x.traceback, parts, left)
                return
        if t is str_:
            append(get(x) or cache_str(x, parts))
        elif t is int_:
            append(small[x] if 0 <= x < 256 else pack_int(0x05, x))
        elif t is dict_t and left:
            dict_(x, parts, left - 1)
        elif t is list_t and left:
            list_(x, parts, left - 1, list_heads)
        elif x is None:
            append(b"\x00")
        elif t is float_:
            append(pack_float(0x06, x))
        elif t is bool_:
            append(b"\x01\x01" if x else b"\x01\x00")
        elif t is bytes_:
            if len_(x) > piece:
                large(x, parts)
            else:
                append(hdr(0x10, len_(x)))
                append(x)
        elif t is tuple_t and left and not v2:  # version 1 writes a tuple as a list
            list_(x, parts, left - 1, list_heads)
        else:
            raise Fallback

    def list_(v: Any, parts: list[bytes], left: int, heads: tuple[bytes, ...]) -> None:
        n = len_(v)
        if len_(parts) + n > max_total:
            raise Fallback
        append = parts.append
        append(heads[n] if n < short else head(heads[0][0], n))
        for x in v:
            t = type(x)
            if t is str_:
                append(get(x) or cache_str(x, parts))
            elif t is int_:
                append(small[x] if 0 <= x < 256 else pack_int(0x05, x))
            elif t is dict_t and left:
                dict_(x, parts, left - 1)
            elif t is list_t and left:
                list_(x, parts, left - 1, list_heads)
            elif x is None:
                append(b"\x00")
            elif t is float_:
                append(pack_float(0x06, x))
            elif t is bool_:
                append(b"\x01\x01" if x else b"\x01\x00")
            elif t is bytes_:
                if len_(x) > piece:
                    large(x, parts)
                else:
                    append(hdr(0x10, len_(x)))
                    append(x)
            else:
                item(x, parts, left)

    def dict_(v: dict[Any, Any], parts: list[bytes], left: int) -> None:
        n = len_(v)
        if len_(parts) + n > max_total:
            raise Fallback
        append = parts.append
        append(dict_heads[n] if n < short else head(0x21, n))
        for k in v:
            x = v[k]
            if type(k) is str_:
                append(get(k) or cache_str(k, parts))
            elif v2 and not (type(k) is float_ and k != k):
                item(k, parts, left)
            else:
                # Version 1: the exact loop refuses it or coerces it (coerce_keys); a NaN: it
                # checks that no other NaN key has its bits.
                raise Fallback
            t = type(x)
            if t is str_:
                append(get(x) or cache_str(x, parts))
            elif t is int_:
                append(small[x] if 0 <= x < 256 else pack_int(0x05, x))
            elif t is list_t and left:
                # A list: encoded here, without calling list_ (lists of scalars are the most
                # common leaves); its items are one level down.
                n = len_(x)
                if len_(parts) + n > max_total:
                    raise Fallback
                append(list_heads[n] if n < short else head(0x20, n))
                inner = left - 1
                for y in x:
                    t = type(y)
                    if t is str_:
                        append(get(y) or cache_str(y, parts))
                    elif t is int_:
                        append(small[y] if 0 <= y < 256 else pack_int(0x05, y))
                    elif t is float_:
                        append(pack_float(0x06, y))
                    elif y is None:
                        append(b"\x00")
                    elif t is bool_:
                        append(b"\x01\x01" if y else b"\x01\x00")
                    elif t is bytes_:
                        if len_(y) > piece:
                            large(y, parts)
                        else:
                            append(hdr(0x10, len_(y)))
                            append(y)
                    elif t is dict_t and inner:
                        dict_(y, parts, inner - 1)
                    elif t is list_t and inner:
                        list_(y, parts, inner - 1, list_heads)
                    else:
                        item(y, parts, inner)
            elif t is dict_t and left:
                dict_(x, parts, left - 1)
            elif x is None:
                append(b"\x00")
            elif t is float_:
                append(pack_float(0x06, x))
            elif t is bool_:
                append(b"\x01\x01" if x else b"\x01\x00")
            elif t is bytes_:
                if len_(x) > piece:
                    large(x, parts)
                else:
                    append(hdr(0x10, len_(x)))
                    append(x)
            else:
                item(x, parts, left)

    return item, dict_

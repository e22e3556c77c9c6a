/* wire._speedups: optional C fast paths for the TLV and CBOR codecs.
 *
 * Each function does the common case and gives up on anything else: it returns None (never
 * raises), and the caller runs the Python code, which gives the same result or names the error
 * with its offset. So this module never has to report an error, and the Python code stays the
 * definition of the format: every path here is tested to agree with it (tests/test_wire/
 * test_speedups.py). Giving up is always safe; accepting something the Python code refuses is the
 * one thing these functions must never do, so every limit is checked as the exact Python loops
 * check it, or more strictly.
 *
 * Only exact built-in types are taken (a subclass such as IntEnum or OrderedDict makes it give
 * up, since the Python code normalises those). No Python code runs while a value is encoded
 * (exact types, slot reads), so the containers cannot change under us. Recursion is bounded by
 * MAX_DEPTH.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

#define MAX_DEPTH 300

int add_id_triple(PyObject *module); /* _speedups_ids.c */

/* The wire value classes and constructors, set once by init(). */
static PyObject *Atom_t, *Pid_t, *Ref_t, *Exit_t, *Error_t;
static PyObject *make_atom, *make_pid, *make_ref;
static PyObject *s_name, *s_node, *s_id, *s_creation, *s_kind, *s_detail, *s_type, *s_message,
    *s_details, *s_traceback;

/* ------------------------------------------------------------------------------------------ */
/* Output buffer */

typedef struct {
    char *buf;
    Py_ssize_t len;
    Py_ssize_t cap;
    Py_ssize_t max; /* max_payload: the buffer never grows past it (the caller checks len) */
    char small[1024];
} Out;

static void out_init(Out *o, Py_ssize_t max) {
    o->buf = o->small;
    o->len = 0;
    o->cap = sizeof(o->small);
    o->max = max;
}

static void out_free(Out *o) {
    if (o->buf != o->small) PyMem_Free(o->buf);
}

/* Make room for n more bytes (the callers check first whether there is room already). */
static int out_reserve(Out *o, Py_ssize_t n) {
    /* Over max_payload: give up before allocating it (the Python code names the error). */
    if (n > o->max - o->len) return -1;
    Py_ssize_t cap = o->cap;
    while (cap < o->len + n) {
        if (cap > PY_SSIZE_T_MAX / 2) return -1;
        cap *= 2;
    }
    if (cap > o->max) cap = o->max;
    char *buf;
    if (o->buf == o->small) {
        buf = PyMem_Malloc(cap);
        if (buf) memcpy(buf, o->small, o->len);
    } else {
        buf = PyMem_Realloc(o->buf, cap);
    }
    if (!buf) return -1;
    o->buf = buf;
    o->cap = cap;
    return 0;
}

static inline int out_write(Out *o, const void *data, Py_ssize_t n) {
    if (n > o->cap - o->len && out_reserve(o, n) < 0) return -1;
    memcpy(o->buf + o->len, data, n);
    o->len += n;
    return 0;
}

static inline int out_byte(Out *o, unsigned char b) {
    if (o->len >= o->cap && out_reserve(o, 1) < 0) return -1;
    o->buf[o->len++] = (char)b;
    return 0;
}

static inline void put_be(unsigned char *p, unsigned long long v, int n) {
    for (int i = n - 1; i >= 0; i--) {
        p[i] = (unsigned char)(v & 0xff);
        v >>= 8;
    }
}

static inline unsigned long long get_be(const unsigned char *p, int n) {
    unsigned long long v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* A NaN float, which a dict holds apart from every other key, even one with the same bits. */
static inline int is_nan(PyObject *x) {
    return Py_TYPE(x) == &PyFloat_Type && isnan(PyFloat_AS_DOUBLE(x));
}

static PyObject *out_bytes(Out *o) {
    return PyBytes_FromStringAndSize(o->buf, o->len);
}

/* Read a slot (or attribute) of a wire value; NULL on failure. */
static inline PyObject *field(PyObject *x, PyObject *name) {
    return PyObject_GetAttr(x, name);
}

/* ------------------------------------------------------------------------------------------ */
/* CBOR: RFC 8949 core deterministic encoding, wire's tags (see wire/_cbor_encode.py) */

typedef struct {
    Out out;
    int bound; /* depth bound: min(max_depth, MAX_DEPTH) */
    Py_ssize_t max_items, max_total, max_str;
    Py_ssize_t total;
} CborEnc;

static int cbor_head(Out *o, int major, unsigned long long n) {
    unsigned char b[9];
    int mt = major << 5;
    if (n < 24) return out_byte(o, (unsigned char)(mt | n));
    if (n < 0x100) {
        b[0] = mt | 24;
        b[1] = (unsigned char)n;
        return out_write(o, b, 2);
    }
    if (n < 0x10000) {
        b[0] = mt | 25;
        put_be(b + 1, n, 2);
        return out_write(o, b, 3);
    }
    if (n < 0x100000000ULL) {
        b[0] = mt | 26;
        put_be(b + 1, n, 4);
        return out_write(o, b, 5);
    }
    b[0] = mt | 27;
    put_be(b + 1, n, 8);
    return out_write(o, b, 9);
}

static int cbor_float(Out *o, double v) {
    unsigned char b[9];
    if (v != v) return out_write(o, "\xf9\x7e\x00", 3);
    /* The shortest of binary16/32/64 that holds v exactly, through the same packing functions
     * as Python's struct (so rounding and overflow behave identically). */
    if (PyFloat_Pack4(v, (char *)b + 1, 0) < 0) {
        PyErr_Clear();
    } else if (PyFloat_Unpack4((const char *)b + 1, 0) == v) {
        unsigned char h[3];
        if (PyFloat_Pack2(v, (char *)h + 1, 0) < 0) {
            PyErr_Clear();
        } else if (PyFloat_Unpack2((const char *)h + 1, 0) == v) {
            h[0] = 0xf9;
            return out_write(o, h, 3);
        }
        b[0] = 0xfa;
        return out_write(o, b, 5);
    }
    b[0] = 0xfb;
    if (PyFloat_Pack8(v, (char *)b + 1, 0) < 0) return -1;
    return out_write(o, b, 9);
}

static int cbor_str(CborEnc *e, PyObject *s) {
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    if (!u || n > e->max_str) return -1;
    if (cbor_head(&e->out, 3, (unsigned long long)n) < 0) return -1;
    return out_write(&e->out, u, n);
}

typedef struct {
    const char *key;
    Py_ssize_t len;
    PyObject *value;
} Pair;

/* RFC 8949's bytewise order of encoded text-string keys is (length, bytes) order: the head
 * grows with the length. */
static int pair_cmp(const void *a, const void *b) {
    const Pair *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return memcmp(x->key, y->key, x->len);
}

static int cbor_value(CborEnc *e, PyObject *x, int depth);

static int cbor_fields(CborEnc *e, PyObject *x, PyObject **names, int n, int depth) {
    e->total += n;
    if (e->total > e->max_total) return -1;
    if (cbor_head(&e->out, 4, n) < 0) return -1;
    for (int i = 0; i < n; i++) {
        PyObject *f = field(x, names[i]);
        if (!f) return -1;
        int r = cbor_value(e, f, depth);
        Py_DECREF(f);
        if (r < 0) return -1;
    }
    return 0;
}

static int cbor_tag(Out *o, unsigned int tag) {
    unsigned char b[3] = {0xd9, (unsigned char)(tag >> 8), (unsigned char)tag};
    return out_write(o, b, 3);
}

static int cbor_value(CborEnc *e, PyObject *x, int depth) {
    PyTypeObject *t = Py_TYPE(x);
    Out *o = &e->out;
    if (t == &PyUnicode_Type) return cbor_str(e, x);
    if (t == &PyLong_Type) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
        if (overflow) {
            if (overflow < 0) return -1; /* below int64: the Python code (major 1 or a bignum) */
            unsigned long long u = PyLong_AsUnsignedLongLong(x);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) return -1;
            return cbor_head(o, 0, u);
        }
        if (v == -1 && PyErr_Occurred()) return -1;
        if (v >= 0) return cbor_head(o, 0, (unsigned long long)v);
        return cbor_head(o, 1, (unsigned long long)(-1 - v));
    }
    if (t == &PyDict_Type) {
        Py_ssize_t n = PyDict_GET_SIZE(x);
        if (n == 0) return out_byte(o, 0xa0);
        if (n > e->max_items || depth >= e->bound) return -1;
        e->total += 2 * n;
        if (e->total > e->max_total) return -1;
        if (cbor_head(o, 5, (unsigned long long)n) < 0) return -1;
        Pair small[8];
        Pair *pairs = n <= 8 ? small : PyMem_Malloc(sizeof(Pair) * n);
        if (!pairs) return -1;
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *v;
        int r = 0;
        while (PyDict_Next(x, &pos, &k, &v)) {
            if (Py_TYPE(k) != &PyUnicode_Type) { /* other keys: the Python code sorts them */
                r = -1;
                break;
            }
            pairs[i].key = PyUnicode_AsUTF8AndSize(k, &pairs[i].len);
            if (!pairs[i].key || pairs[i].len > e->max_str) {
                r = -1;
                break;
            }
            pairs[i].value = v;
            i++;
        }
        if (r == 0) {
            qsort(pairs, n, sizeof(Pair), pair_cmp);
            for (i = 0; i < n; i++) {
                if (cbor_head(o, 3, (unsigned long long)pairs[i].len) < 0 ||
                    out_write(o, pairs[i].key, pairs[i].len) < 0 ||
                    cbor_value(e, pairs[i].value, depth + 1) < 0) {
                    r = -1;
                    break;
                }
            }
        }
        if (pairs != small) PyMem_Free(pairs);
        return r;
    }
    if (t == &PyList_Type || t == &PyTuple_Type) {
        Py_ssize_t n = Py_SIZE(x);
        PyObject **items = t == &PyList_Type ? ((PyListObject *)x)->ob_item
                                             : ((PyTupleObject *)x)->ob_item;
        int inner = depth;
        if (t == &PyTuple_Type) {
            /* The tag encloses the array; the array encloses the items. */
            if (depth >= e->bound || (n && depth + 1 >= e->bound)) return -1;
            if (cbor_tag(o, 61441) < 0) return -1;
            inner = depth + 1;
        }
        if (n == 0) return out_byte(o, 0x80);
        if (n > e->max_items || inner >= e->bound) return -1;
        e->total += n;
        if (e->total > e->max_total) return -1;
        if (cbor_head(o, 4, (unsigned long long)n) < 0) return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            /* (A list cannot change here: no Python code runs while encoding.) */
            if (cbor_value(e, items[i], inner + 1) < 0) return -1;
        }
        return 0;
    }
    if (t == &PyFloat_Type) return cbor_float(o, PyFloat_AS_DOUBLE(x));
    if (x == Py_None) return out_byte(o, 0xf6);
    if (x == Py_True) return out_byte(o, 0xf5);
    if (x == Py_False) return out_byte(o, 0xf4);
    if (t == &PyBytes_Type) {
        Py_ssize_t n = PyBytes_GET_SIZE(x);
        if (n > e->max_str) return -1;
        if (cbor_head(o, 2, (unsigned long long)n) < 0) return -1;
        return out_write(o, PyBytes_AS_STRING(x), n);
    }
    if ((PyObject *)t == Atom_t) {
        if (depth >= e->bound) return -1;
        PyObject *name = field(x, s_name);
        if (!name) return -1;
        int r = -1;
        if (Py_TYPE(name) == &PyUnicode_Type && cbor_tag(o, 61440) == 0) r = cbor_str(e, name);
        Py_DECREF(name);
        return r;
    }
    if ((PyObject *)t == Pid_t || (PyObject *)t == Ref_t || (PyObject *)t == Exit_t ||
        (PyObject *)t == Error_t) {
        if (depth + 1 >= e->bound) return -1;
        PyObject *ids[3] = {s_node, s_id, s_creation};
        PyObject *exit[2] = {s_kind, s_detail};
        PyObject *error[4] = {s_type, s_message, s_details, s_traceback};
        if ((PyObject *)t == Pid_t || (PyObject *)t == Ref_t) {
            if (cbor_tag(o, (PyObject *)t == Pid_t ? 61442 : 61443) < 0) return -1;
            return cbor_fields(e, x, ids, 3, depth + 2);
        }
        if ((PyObject *)t == Exit_t) {
            if (cbor_tag(o, 61444) < 0) return -1;
            return cbor_fields(e, x, exit, 2, depth + 2);
        }
        if (cbor_tag(o, 61445) < 0) return -1;
        return cbor_fields(e, x, error, 4, depth + 2);
    }
    return -1;
}

static PyObject *cbor_encode(PyObject *self, PyObject *args) {
    PyObject *value;
    int max_depth;
    Py_ssize_t max_items, max_total, max_str, max_payload = PY_SSIZE_T_MAX;
    if (!PyArg_ParseTuple(args, "Oinnn|n", &value, &max_depth, &max_items, &max_total, &max_str,
                          &max_payload))
        return NULL;
    if (!Atom_t) Py_RETURN_NONE;
    CborEnc e;
    out_init(&e.out, max_payload);
    e.bound = max_depth < MAX_DEPTH ? max_depth : MAX_DEPTH;
    e.max_items = max_items;
    e.max_total = max_total;
    e.max_str = max_str;
    e.total = 1;
    PyObject *result;
    if (cbor_value(&e, value, 0) < 0 || e.out.len > max_payload) {
        PyErr_Clear();
        result = Py_NewRef(Py_None);
    } else {
        result = out_bytes(&e.out);
    }
    out_free(&e.out);
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* TLV encoding (see wire/_tlv_encode.py and wire/_tlv_fast.py) */

typedef struct {
    Out out;
    int v2;
    Py_ssize_t max_items, max_total, max_str;
    Py_ssize_t total;
} TlvEnc;

static inline int tlv_hdr(Out *o, unsigned char code, unsigned long long n) {
    unsigned char b[5];
    b[0] = code;
    put_be(b + 1, n, 4);
    return out_write(o, b, 5);
}

static int tlv_text(TlvEnc *e, unsigned char code, PyObject *s, Py_ssize_t max) {
    Py_ssize_t n;
    if (Py_TYPE(s) != &PyUnicode_Type) return -1;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    if (!u || n > max) return -1;
    if (tlv_hdr(&e->out, code, (unsigned long long)n) < 0) return -1;
    return out_write(&e->out, u, n);
}

static int tlv_value(TlvEnc *e, PyObject *x, int left);

static int tlv_fields(TlvEnc *e, PyObject *x, PyObject **names, int n, int left) {
    e->total += n;
    if (e->total > e->max_total) return -1;
    for (int i = 0; i < n; i++) {
        PyObject *f = field(x, names[i]);
        if (!f) return -1;
        int r = tlv_value(e, f, left);
        Py_DECREF(f);
        if (r < 0) return -1;
    }
    return 0;
}

/* ``left``: the container levels still allowed (a list, dict, tuple, exit reason or error value
 * takes one, empty or not). */
static int tlv_value(TlvEnc *e, PyObject *x, int left) {
    PyTypeObject *t = Py_TYPE(x);
    Out *o = &e->out;
    if (t == &PyUnicode_Type) return tlv_text(e, 0x11, x, e->max_str);
    if (t == &PyLong_Type) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) return -1;
        unsigned char b[9];
        b[0] = 0x05;
        put_be(b + 1, (unsigned long long)v, 8);
        return out_write(o, b, 9);
    }
    if (t == &PyDict_Type) {
        Py_ssize_t n = PyDict_GET_SIZE(x);
        if (!left || n > e->max_items) return -1;
        e->total += 2 * n;
        if (e->total > e->max_total) return -1;
        if (tlv_hdr(o, 0x21, (unsigned long long)n) < 0) return -1;
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(x, &pos, &k, &v)) {
            if (Py_TYPE(k) == &PyUnicode_Type) {
                if (tlv_text(e, 0x11, k, e->max_str) < 0) return -1;
            } else if (!e->v2 || is_nan(k) || tlv_value(e, k, left - 1) < 0) {
                /* Version 1: the Python code refuses or coerces it; a NaN: it checks that no
                 * other NaN key has the same bits. */
                return -1;
            }
            if (tlv_value(e, v, left - 1) < 0) return -1;
        }
        return 0;
    }
    if (t == &PyList_Type || t == &PyTuple_Type) {
        Py_ssize_t n = Py_SIZE(x);
        PyObject **items = t == &PyList_Type ? ((PyListObject *)x)->ob_item
                                             : ((PyTupleObject *)x)->ob_item;
        if (!left || n > e->max_items) return -1;
        e->total += n;
        if (e->total > e->max_total) return -1;
        /* Version 1 writes a tuple as a list, as Gunicorn does. */
        if (tlv_hdr(o, t == &PyTuple_Type && e->v2 ? 0x22 : 0x20, (unsigned long long)n) < 0)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (tlv_value(e, items[i], left - 1) < 0) return -1;
        }
        return 0;
    }
    if (x == Py_None) return out_byte(o, 0x00);
    if (t == &PyFloat_Type) {
        unsigned char b[9];
        b[0] = 0x06;
        if (PyFloat_Pack8(PyFloat_AS_DOUBLE(x), (char *)b + 1, 0) < 0) return -1;
        return out_write(o, b, 9);
    }
    if (x == Py_True) return out_write(o, "\x01\x01", 2);
    if (x == Py_False) return out_write(o, "\x01\x00", 2);
    if (t == &PyBytes_Type) {
        Py_ssize_t n = PyBytes_GET_SIZE(x);
        if (n > e->max_str) return -1;
        if (tlv_hdr(o, 0x10, (unsigned long long)n) < 0) return -1;
        return out_write(o, PyBytes_AS_STRING(x), n);
    }
    if (!e->v2) return -1;
    if ((PyObject *)t == Pid_t || (PyObject *)t == Ref_t) {
        PyObject *node = field(x, s_node), *id = field(x, s_id), *cr = field(x, s_creation);
        int r = -1;
        if (node && id && cr && Py_TYPE(id) == &PyLong_Type && Py_TYPE(cr) == &PyLong_Type) {
            unsigned long long i = PyLong_AsUnsignedLongLong(id);
            unsigned long c = PyLong_AsUnsignedLong(cr);
            if (!PyErr_Occurred() && c <= 0xffffffffUL &&
                tlv_text(e, (PyObject *)t == Pid_t ? 0x30 : 0x31, node, 255) == 0) {
                unsigned char b[12];
                put_be(b, i, 8);
                put_be(b + 8, c, 4);
                r = out_write(o, b, 12);
            }
        }
        Py_XDECREF(node);
        Py_XDECREF(id);
        Py_XDECREF(cr);
        return r;
    }
    if ((PyObject *)t == Atom_t) {
        PyObject *name = field(x, s_name);
        if (!name) return -1;
        int r = tlv_text(e, 0x12, name, 255);
        Py_DECREF(name);
        return r;
    }
    if ((PyObject *)t == Exit_t || (PyObject *)t == Error_t) {
        if (!left) return -1;
        if ((PyObject *)t == Exit_t) {
            PyObject *names[2] = {s_kind, s_detail};
            if (out_byte(o, 0x32) < 0) return -1;
            return tlv_fields(e, x, names, 2, left - 1);
        }
        PyObject *names[4] = {s_type, s_message, s_details, s_traceback};
        if (out_byte(o, 0x33) < 0) return -1;
        return tlv_fields(e, x, names, 4, left - 1);
    }
    return -1;
}

/* Arguments of the METH_FASTCALL functions (the codecs' per-value calls, where a format string's
 * parsing cost as much as encoding a small value): what PyArg_ParseTuple's "n", "i" and "p"
 * take, with its errors. Each returns -1 with an exception set on a bad argument. */
static int arg_count(const char *name, Py_ssize_t nargs, Py_ssize_t least, Py_ssize_t most) {
    if (nargs >= least && nargs <= most) return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd to %zd arguments (%zd given)", name, least, most,
                 nargs);
    return -1;
}

static int arg_ssize(PyObject *o, Py_ssize_t *out) {
    Py_ssize_t v = PyNumber_AsSsize_t(o, PyExc_OverflowError);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

static int arg_int(PyObject *o, int *out) {
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < INT_MIN || v > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "signed integer is out of range for a C int");
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int arg_bool(PyObject *o, int *out) {
    int v = PyObject_IsTrue(o);
    if (v < 0) return -1;
    *out = v;
    return 0;
}

static PyObject *tlv_encode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *value;
    int v2, max_depth;
    Py_ssize_t max_items, max_total, max_str, max_payload = PY_SSIZE_T_MAX;
    if (arg_count("tlv_encode", nargs, 6, 7) < 0 || arg_bool(args[1], &v2) < 0 ||
        arg_int(args[2], &max_depth) < 0 || arg_ssize(args[3], &max_items) < 0 ||
        arg_ssize(args[4], &max_total) < 0 || arg_ssize(args[5], &max_str) < 0 ||
        (nargs == 7 && arg_ssize(args[6], &max_payload) < 0))
        return NULL;
    value = args[0];
    if (!Atom_t || max_depth > MAX_DEPTH) Py_RETURN_NONE;
    TlvEnc e;
    out_init(&e.out, max_payload);
    e.v2 = v2;
    e.max_items = max_items;
    e.max_total = max_total;
    e.max_str = max_str;
    e.total = 1;
    PyObject *result;
    if (tlv_value(&e, value, max_depth) < 0 || e.out.len > max_payload) {
        PyErr_Clear();
        result = Py_NewRef(Py_None);
    } else {
        result = out_bytes(&e.out);
    }
    out_free(&e.out);
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* TLV decoding. The caller passes only payloads no longer than max_total_items and max_str,
 * which bound those two limits by themselves (every item takes at least a byte). */

typedef struct {
    const unsigned char *p;
    Py_ssize_t end;
    int v2;
    Py_ssize_t max_items;
} TlvDec;

/* Put the decoded pair (k, v) into dict as its entry number i, taking both references;
 * -1 (dict released too) when either is NULL, the key is unhashable, or it repeats an earlier
 * key (the size shows it: the Python code refuses duplicates). */
static int dict_take(PyObject *dict, PyObject *k, PyObject *v, Py_ssize_t i) {
    int failed = !v || PyDict_SetItem(dict, k, v) < 0 || PyDict_GET_SIZE(dict) != i + 1;
    Py_XDECREF(k);
    Py_XDECREF(v);
    if (failed) {
        Py_DECREF(dict);
        return -1;
    }
    return 0;
}

static PyObject *tlv_decode_value(TlvDec *d, Py_ssize_t *off, int left);

/* Decoded atoms and pids, by their encoded bytes (as Erlang's distribution caches atoms per
 * connection): the same few pids and atoms head most frames (a call's sender, "$gen_call"),
 * and a hit costs a hash and a memcmp instead of a str decode and an object. Direct-mapped
 * and bounded; sharing an entry is safe because wire's values are frozen. Refs are not cached
 * (each call makes a new one). */
#define ID_CACHE_SIZE 256
#define ID_CACHE_MAX_KEY 300
typedef struct {
    PyObject *key; /* the encoded bytes (type byte to the end of the value) */
    PyObject *value;
} IdEntry;
static IdEntry id_cache[ID_CACHE_SIZE];

static inline size_t id_hash(const unsigned char *p, Py_ssize_t n) {
    size_t h = 14695981039346656037ULL;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return (h ^ (h >> 29)) % ID_CACHE_SIZE;
}

static inline IdEntry *id_lookup(const unsigned char *p, Py_ssize_t n) {
    IdEntry *e = &id_cache[id_hash(p, n)];
    return e;
}

static inline int id_matches(IdEntry *e, const unsigned char *p, Py_ssize_t n) {
    return e->key && PyBytes_GET_SIZE(e->key) == n && memcmp(PyBytes_AS_STRING(e->key), p, n) == 0;
}

static void id_store(IdEntry *e, const unsigned char *p, Py_ssize_t n, PyObject *value) {
    if (n > ID_CACHE_MAX_KEY) return;
    PyObject *key = PyBytes_FromStringAndSize((const char *)p, n);
    if (!key) {
        PyErr_Clear();
        return;
    }
    PyObject *old_key = e->key, *old_value = e->value;
    e->key = key;
    e->value = Py_NewRef(value);
    Py_XDECREF(old_key);
    Py_XDECREF(old_value);
}

/* The slot descriptors of Atom.name, Pid's and Ref's node, id, creation (set by init() when
 * the classes have them): a value is built as the Python constructors in _tlv_fast build it
 * (object.__new__ and the slots' setters, no validators: the decoder checked the fields),
 * without a Python call. */
static PyObject *d_atom_name, *d_pid[3], *d_ref[3];

static PyObject *build(PyObject *cls, PyObject **descrs, PyObject **fields, int n) {
    PyTypeObject *t = (PyTypeObject *)cls;
    PyObject *obj = t->tp_alloc(t, 0);
    if (!obj) return NULL;
    for (int i = 0; i < n; i++) {
        if (Py_TYPE(descrs[i])->tp_descr_set(descrs[i], obj, fields[i]) < 0) {
            Py_DECREF(obj);
            return NULL;
        }
    }
    return obj;
}

/* A u32 length or count at *off + 1 (after a type byte); -1 if the bytes are not there. */
static inline long long tlv_u32(TlvDec *d, Py_ssize_t off) {
    if (off + 5 > d->end) return -1;
    return (long long)get_be(d->p + off + 1, 4);
}

static PyObject *tlv_decode_text(TlvDec *d, Py_ssize_t *off, Py_ssize_t max) {
    long long n = tlv_u32(d, *off);
    if (n < 0 || n > max || *off + 5 + n > d->end) return NULL;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)d->p + *off + 5, (Py_ssize_t)n, "strict");
    *off += 5 + n;
    return s;
}

static PyObject *tlv_decode_items(TlvDec *d, Py_ssize_t *off, int left) {
    long long n = tlv_u32(d, *off);
    /* Every item takes at least a byte: a count the rest cannot hold is cut short. */
    if (n < 0 || n > d->max_items || n > d->end - *off - 5 || !left) return NULL;
    *off += 5;
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = tlv_decode_value(d, off, left - 1);
        if (!v) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, v);
    }
    return list;
}

static PyObject *tlv_decode_value(TlvDec *d, Py_ssize_t *off, int left) {
    if (*off >= d->end) return NULL;
    const unsigned char *p = d->p + *off;
    switch (p[0]) {
    case 0x11:
        return tlv_decode_text(d, off, PY_SSIZE_T_MAX);
    case 0x05:
        if (*off + 9 > d->end) return NULL;
        *off += 9;
        return PyLong_FromLongLong((long long)get_be(p + 1, 8));
    case 0x21: {
        long long n = tlv_u32(d, *off);
        if (n < 0 || n > d->max_items || 2 * n > d->end - *off - 5 || !left) return NULL;
        *off += 5;
        PyObject *dict = PyDict_New();
        if (!dict) return NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *k;
            if (*off < d->end && d->p[*off] == 0x11) {
                k = tlv_decode_text(d, off, PY_SSIZE_T_MAX);
            } else if (d->v2) {
                k = tlv_decode_value(d, off, left - 1);
                if (k && is_nan(k)) Py_CLEAR(k); /* the Python code checks NaN keys */
            } else {
                k = NULL; /* version 1 keys are str */
            }
            PyObject *v = k ? tlv_decode_value(d, off, left - 1) : NULL;
            if (dict_take(dict, k, v, i) < 0) return NULL;
        }
        return dict;
    }
    case 0x20:
        return tlv_decode_items(d, off, left);
    case 0x00:
        *off += 1;
        Py_RETURN_NONE;
    case 0x01:
        if (*off + 2 > d->end || p[1] > 1) return NULL;
        *off += 2;
        return PyBool_FromLong(p[1]);
    case 0x06: {
        if (*off + 9 > d->end) return NULL;
        double v = PyFloat_Unpack8((const char *)p + 1, 0);
        if (v == -1.0 && PyErr_Occurred()) return NULL;
        *off += 9;
        return PyFloat_FromDouble(v);
    }
    case 0x10: {
        long long n = tlv_u32(d, *off);
        if (n < 0 || *off + 5 + n > d->end) return NULL;
        *off += 5 + n;
        return PyBytes_FromStringAndSize((const char *)p + 5, (Py_ssize_t)n);
    }
    }
    if (!d->v2) return NULL;
    switch (p[0]) {
    case 0x22: {
        PyObject *list = tlv_decode_items(d, off, left);
        if (!list) return NULL;
        PyObject *tuple = PyList_AsTuple(list);
        Py_DECREF(list);
        return tuple;
    }
    case 0x12: {
        Py_ssize_t start = *off;
        long long n = tlv_u32(d, start);
        IdEntry *e = NULL;
        if (n >= 0 && n <= 255 && start + 5 + n <= d->end) {
            e = id_lookup(p, 5 + n);
            if (id_matches(e, p, 5 + n)) {
                *off += 5 + n;
                return Py_NewRef(e->value);
            }
        }
        PyObject *name = tlv_decode_text(d, off, 255);
        if (!name) return NULL;
        PyObject *atom = d_atom_name ? build(Atom_t, &d_atom_name, &name, 1)
                                     : PyObject_CallOneArg(make_atom, name);
        Py_DECREF(name);
        if (atom && e) id_store(e, p, *off - start, atom);
        return atom;
    }
    case 0x30:
    case 0x31: {
        Py_ssize_t start = *off;
        long long n = tlv_u32(d, start);
        IdEntry *e = NULL;
        if (p[0] == 0x30 && n >= 0 && n <= 255 && start + 17 + n <= d->end) {
            e = id_lookup(p, 17 + n);
            if (id_matches(e, p, 17 + n)) {
                *off += 17 + n;
                return Py_NewRef(e->value);
            }
        }
        PyObject *node = tlv_decode_text(d, off, 255);
        if (!node) return NULL;
        if (*off + 12 > d->end) {
            Py_DECREF(node);
            return NULL;
        }
        PyObject *id = PyLong_FromUnsignedLongLong(get_be(d->p + *off, 8));
        PyObject *cr = PyLong_FromUnsignedLongLong(get_be(d->p + *off + 8, 4));
        *off += 12;
        PyObject *r = NULL;
        if (id && cr) {
            PyObject *argv[3] = {node, id, cr};
            PyObject **descrs = p[0] == 0x30 ? d_pid : d_ref;
            r = descrs[0] ? build(p[0] == 0x30 ? Pid_t : Ref_t, descrs, argv, 3)
                          : PyObject_Vectorcall(p[0] == 0x30 ? make_pid : make_ref, argv, 3, NULL);
        }
        Py_DECREF(node);
        Py_XDECREF(id);
        Py_XDECREF(cr);
        if (r && e) id_store(e, p, *off - start, r);
        return r;
    }
    case 0x32:
    case 0x33: {
        if (!left) return NULL;
        int n = p[0] == 0x32 ? 2 : 4;
        PyObject *argv[4] = {NULL, NULL, NULL, NULL};
        *off += 1;
        PyObject *r = NULL;
        int i;
        for (i = 0; i < n; i++) {
            argv[i] = tlv_decode_value(d, off, left - 1);
            if (!argv[i]) break;
        }
        /* The constructors check the fields as the exact loop does. */
        if (i == n) r = PyObject_Vectorcall(p[0] == 0x32 ? Exit_t : Error_t, argv, n, NULL);
        for (i = 0; i < n; i++) Py_XDECREF(argv[i]);
        return r;
    }
    }
    return NULL; /* a big int, an unknown type code */
}

/* ``(value, n)``, stealing ``value`` (NULL if either is NULL): the codecs' "what and how far"
 * results, built directly (Py_BuildValue parses its format string on every call: gd1_scan and
 * tlv_decode of a small value took 280 and 470 instructions more a call, callgrind). */
static PyObject *value_and_offset(PyObject *value, Py_ssize_t n) {
    if (!value) return NULL;
    PyObject *off = PyLong_FromSsize_t(n);
    PyObject *pair = off ? PyTuple_New(2) : NULL;
    if (!pair) {
        Py_DECREF(value);
        Py_XDECREF(off);
        return NULL;
    }
    PyTuple_SET_ITEM(pair, 0, value);
    PyTuple_SET_ITEM(pair, 1, off);
    return pair;
}

static PyObject *tlv_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *data;
    Py_buffer buf;
    int v2, max_depth;
    Py_ssize_t max_items;
    if (arg_count("tlv_decode", nargs, 4, 4) < 0 || arg_bool(args[1], &v2) < 0 ||
        arg_int(args[2], &max_depth) < 0 || arg_ssize(args[3], &max_items) < 0)
        return NULL;
    data = args[0];
    if (!Atom_t || max_depth > MAX_DEPTH) Py_RETURN_NONE;
    if (PyObject_GetBuffer(data, &buf, PyBUF_SIMPLE) < 0) {
        PyErr_Clear(); /* (a non-contiguous buffer, say: the Python code copies it) */
        Py_RETURN_NONE;
    }
    TlvDec d = {buf.buf, buf.len, v2, max_items};
    Py_ssize_t off = 0;
    PyObject *value = tlv_decode_value(&d, &off, max_depth);
    PyBuffer_Release(&buf);
    if (!value) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return value_and_offset(value, off);
}

/* ------------------------------------------------------------------------------------------ */
/* Frames: FrameDecoder._parse's loop for its common case, version 2 frames with a TLV payload
 * the fast decoder takes whole (what a distribution connection reads). It stops at the first
 * frame it does not take (incomplete, another version or codec, an unknown type, a payload
 * past max_payload or fast_size, one the fast decoder refuses or that leaves bytes over), and
 * the Python loop goes on from there, which delivers or names it as it always does. */

static PyObject *Frame_t, *frame_descrs[5], *frame_types[128], *codec_tlv, *codec_cbor, *version_2;

static PyObject *frames_init(PyObject *self, PyObject *args) {
    PyObject *cls, *types, *codec, *cbor_codec;
    if (!PyArg_ParseTuple(args, "OO!OO", &cls, &PyDict_Type, &types, &codec, &cbor_codec))
        return NULL;
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "frames_init: Frame must be a class");
        return NULL;
    }
    /* Frame's slots in the order tlv_frames sets them. */
    const char *names[5] = {"type", "request_id", "payload", "version", "codec"};
    PyObject *found[5];
    for (int i = 0; i < 5; i++) {
        found[i] = PyDict_GetItemString(((PyTypeObject *)cls)->tp_dict, names[i]);
        if (!found[i] || Py_TYPE(found[i]) != &PyMemberDescr_Type) {
            PyErr_Format(PyExc_TypeError, "frames_init: Frame.%s is not a slot", names[i]);
            return NULL;
        }
    }
    for (int i = 0; i < 5; i++) Py_XSETREF(frame_descrs[i], Py_NewRef(found[i]));
    for (int i = 0; i < 128; i++) {
        PyObject *key = PyLong_FromLong(i);
        if (!key) return NULL;
        PyObject *t = PyDict_GetItemWithError(types, key);
        Py_DECREF(key);
        if (!t && PyErr_Occurred()) return NULL;
        Py_XSETREF(frame_types[i], Py_XNewRef(t));
    }
    Py_XSETREF(codec_tlv, Py_NewRef(codec));
    Py_XSETREF(codec_cbor, Py_NewRef(cbor_codec));
    if (!version_2 && !(version_2 = PyLong_FromLong(2))) return NULL;
    Py_XSETREF(Frame_t, Py_NewRef(cls));
    Py_RETURN_NONE;
}

/* The frame loop of tlv_frames and frames (below, after the CBOR decoder it uses). */
static PyObject *frames_loop(PyObject *args, int cbor);

static PyObject *tlv_frames(PyObject *self, PyObject *args) { return frames_loop(args, 0); }

/* ------------------------------------------------------------------------------------------ */
/* CBOR decoding's check (see _check_result in wire/_cbor.py): whether a decoded value holds only
 * wire's types, and how many NaNs it holds. cbor2 builds exact built-in types, so an exact type
 * test per item suffices; anything else (undefined, a simple value, a frozendict key, a subclass)
 * makes it give up, and the Python walk names it. Only slots are read, so no Python code runs
 * and the containers cannot change under us. Nesting past MAX_DEPTH also gives up. */

static Py_ssize_t cbor_check_value(PyObject *x, int depth);

static Py_ssize_t cbor_check_items(PyObject **items, Py_ssize_t n, int depth) {
    Py_ssize_t nans = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t r = cbor_check_value(items[i], depth);
        if (r < 0) return -1;
        nans += r;
    }
    return nans;
}

static Py_ssize_t cbor_check_field(PyObject *x, PyObject *name, int depth) {
    PyObject *f = field(x, name);
    if (!f) return -1;
    Py_ssize_t r = cbor_check_value(f, depth);
    Py_DECREF(f);
    return r;
}

static Py_ssize_t cbor_check_value(PyObject *x, int depth) {
    PyTypeObject *t = Py_TYPE(x);
    if (t == &PyUnicode_Type || t == &PyLong_Type || t == &PyBytes_Type || t == &PyBool_Type ||
        x == Py_None || (PyObject *)t == Atom_t || (PyObject *)t == Pid_t ||
        (PyObject *)t == Ref_t)
        return 0;
    if (t == &PyFloat_Type) return isnan(PyFloat_AS_DOUBLE(x)) ? 1 : 0;
    if (depth >= MAX_DEPTH) return -1;
    if (t == &PyList_Type)
        return cbor_check_items(((PyListObject *)x)->ob_item, Py_SIZE(x), depth + 1);
    if (t == &PyTuple_Type)
        return cbor_check_items(((PyTupleObject *)x)->ob_item, Py_SIZE(x), depth + 1);
    if (t == &PyDict_Type) {
        Py_ssize_t pos = 0, nans = 0, r;
        PyObject *k, *v;
        while (PyDict_Next(x, &pos, &k, &v)) {
            if ((r = cbor_check_value(k, depth + 1)) < 0) return -1;
            nans += r;
            if ((r = cbor_check_value(v, depth + 1)) < 0) return -1;
            nans += r;
        }
        return nans;
    }
    if ((PyObject *)t == Exit_t) return cbor_check_field(x, s_detail, depth + 1);
    if ((PyObject *)t == Error_t) return cbor_check_field(x, s_details, depth + 1);
    return -1;
}

static PyObject *cbor_check(PyObject *self, PyObject *arg) {
    if (!Atom_t) Py_RETURN_NONE;
    Py_ssize_t nans = cbor_check_value(arg, 0);
    if (nans < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return PyLong_FromSsize_t(nans);
}

/* ------------------------------------------------------------------------------------------ */
/* CBOR decoding (cbor_decode in wire/_cbor.py, which runs cbor2 and then checks the result) of
 * what matching and distribution payloads hold: definite lengths; ints from -2**63 to 2**64-1;
 * text; bytes; arrays; maps whose keys are ints, text, bytes, false, true or null; floats;
 * false, true, null. Anything else gives up: a tag (wire's own, bignums), an indefinite
 * length, undefined or another simple value, a float map key (NaN keys are the Python code's),
 * a longer int, invalid UTF-8, a duplicate key, bytes left after the value, a count over
 * max_items or past the end of the data, nesting past the depth bound. The caller passes only
 * payloads no longer than max_total_items and max_str, which bound those two by themselves.
 * Arrays are lists and maps dicts, as cbor2 builds them outside a tag. */

typedef struct {
    const unsigned char *p;
    Py_ssize_t end;
    Py_ssize_t max_items;
} CborDec;

/* Map keys, by their encoded bytes: the same few keys head every payload ("delivery", "op",
 * "args", ...), and a hit costs a hash and a memcmp instead of a str decode and its hash.
 * Direct-mapped and bounded; sharing is safe because str is immutable. */
#define KEY_CACHE_SIZE 256
#define KEY_CACHE_MAX 32
typedef struct {
    Py_ssize_t len;
    unsigned char bytes[KEY_CACHE_MAX];
    PyObject *value;
} KeyEntry;
static KeyEntry key_cache[KEY_CACHE_SIZE];

/* The argument of the head at *off of additional info below 28 (advancing *off past the
 * head); -1 for 28..31 (reserved, indefinite) or a head cut short. */
static inline int cbor_arg(CborDec *d, Py_ssize_t *off, unsigned long long *n) {
    unsigned char ai = d->p[*off] & 0x1f;
    Py_ssize_t o = *off + 1;
    if (ai < 24) {
        *n = ai;
        *off = o;
        return 0;
    }
    if (ai > 27) return -1;
    int k = 1 << (ai - 24);
    if (k > d->end - o) return -1;
    *n = get_be(d->p + o, k);
    *off = o + k;
    return 0;
}

static PyObject *cbor_decode_value(CborDec *d, Py_ssize_t *off, int left);

static PyObject *cbor_decode_text(CborDec *d, Py_ssize_t *off, int key) {
    unsigned long long n;
    if (cbor_arg(d, off, &n) < 0 || n > (unsigned long long)(d->end - *off)) return NULL;
    const unsigned char *p = d->p + *off;
    *off += (Py_ssize_t)n;
    if (!key || n > KEY_CACHE_MAX)
        return PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)n, "strict");
    size_t h = 14695981039346656037ULL;
    for (unsigned long long i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    KeyEntry *e = &key_cache[(h ^ (h >> 29)) % KEY_CACHE_SIZE];
    if (e->value && e->len == (Py_ssize_t)n && memcmp(e->bytes, p, n) == 0)
        return Py_NewRef(e->value);
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)n, "strict");
    if (!s) return NULL;
    if (PyObject_Hash(s) == -1) {
        Py_DECREF(s);
        return NULL;
    }
    Py_XSETREF(e->value, Py_NewRef(s));
    e->len = (Py_ssize_t)n;
    memcpy(e->bytes, p, n);
    return s;
}

static PyObject *cbor_decode_int(CborDec *d, Py_ssize_t *off) {
    int negative = (d->p[*off] >> 5) == 1;
    unsigned long long n;
    if (cbor_arg(d, off, &n) < 0) return NULL;
    if (!negative) return PyLong_FromUnsignedLongLong(n);
    if (n > (unsigned long long)LLONG_MAX) return NULL; /* below -2**63: the Python code's */
    return PyLong_FromLongLong(-1 - (long long)n);
}

/* A map key: an int, text, bytes, false, true or null (NULL: give up). */
static PyObject *cbor_decode_key(CborDec *d, Py_ssize_t *off) {
    if (*off >= d->end) return NULL;
    unsigned char b = d->p[*off];
    switch (b >> 5) {
    case 0:
    case 1:
        return cbor_decode_int(d, off);
    case 3:
        return cbor_decode_text(d, off, 1);
    case 2:
        return cbor_decode_value(d, off, 0);
    case 7:
        if (b >= 0xf4 && b <= 0xf6) return cbor_decode_value(d, off, 0);
        return NULL;
    }
    return NULL;
}

static PyObject *cbor_decode_value(CborDec *d, Py_ssize_t *off, int left) {
    if (*off >= d->end) return NULL;
    const unsigned char *p = d->p + *off;
    unsigned long long n;
    switch (p[0] >> 5) {
    case 0:
    case 1:
        return cbor_decode_int(d, off);
    case 2: {
        if (cbor_arg(d, off, &n) < 0 || n > (unsigned long long)(d->end - *off)) return NULL;
        PyObject *b = PyBytes_FromStringAndSize((const char *)d->p + *off, (Py_ssize_t)n);
        *off += (Py_ssize_t)n;
        return b;
    }
    case 3:
        return cbor_decode_text(d, off, 0);
    case 4: {
        /* Every item takes at least a byte: a count the rest cannot hold is cut short. */
        if (!left || cbor_arg(d, off, &n) < 0 || n > (unsigned long long)d->max_items ||
            n > (unsigned long long)(d->end - *off))
            return NULL;
        PyObject *list = PyList_New((Py_ssize_t)n);
        if (!list) return NULL;
        for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++) {
            PyObject *v = cbor_decode_value(d, off, left - 1);
            if (!v) {
                Py_DECREF(list);
                return NULL;
            }
            PyList_SET_ITEM(list, i, v);
        }
        return list;
    }
    case 5: {
        if (!left || cbor_arg(d, off, &n) < 0 || n > (unsigned long long)d->max_items ||
            2 * n > (unsigned long long)(d->end - *off))
            return NULL;
        PyObject *dict = PyDict_New();
        if (!dict) return NULL;
        for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++) {
            PyObject *k = cbor_decode_key(d, off);
            PyObject *v = k ? cbor_decode_value(d, off, left - 1) : NULL;
            if (dict_take(dict, k, v, i) < 0) return NULL;
        }
        return dict;
    }
    case 7: {
        double x;
        switch (p[0] & 0x1f) {
        case 20:
            *off += 1;
            Py_RETURN_FALSE;
        case 21:
            *off += 1;
            Py_RETURN_TRUE;
        case 22:
            *off += 1;
            Py_RETURN_NONE;
        case 25:
            if (d->end - *off < 3) return NULL;
            x = PyFloat_Unpack2((const char *)p + 1, 0);
            *off += 3;
            break;
        case 26:
            if (d->end - *off < 5) return NULL;
            x = PyFloat_Unpack4((const char *)p + 1, 0);
            *off += 5;
            break;
        case 27:
            if (d->end - *off < 9) return NULL;
            x = PyFloat_Unpack8((const char *)p + 1, 0);
            *off += 9;
            break;
        default:
            return NULL; /* undefined, another simple value, a break */
        }
        if (x == -1.0 && PyErr_Occurred()) return NULL;
        return PyFloat_FromDouble(x);
    }
    }
    return NULL; /* a tag */
}

static PyObject *cbor_decode(PyObject *self, PyObject *args) {
    PyObject *data;
    Py_buffer buf;
    int max_depth;
    Py_ssize_t max_items;
    if (!PyArg_ParseTuple(args, "Oin", &data, &max_depth, &max_items)) return NULL;
    if (PyObject_GetBuffer(data, &buf, PyBUF_SIMPLE) < 0) {
        PyErr_Clear(); /* (a non-contiguous buffer, say: the Python code copies it) */
        Py_RETURN_NONE;
    }
    CborDec d = {buf.buf, buf.len, max_items};
    Py_ssize_t off = 0;
    PyObject *value =
        cbor_decode_value(&d, &off, max_depth < MAX_DEPTH ? max_depth : MAX_DEPTH);
    PyBuffer_Release(&buf);
    if (!value || off != d.end) {
        Py_XDECREF(value);
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(N)", value);
}

/* ------------------------------------------------------------------------------------------ */
/* The frame loop: the version 2 frames from pos that it decodes whole (TLV payloads no longer
 * than fast_size; with cbor, CBOR payloads no longer than cbor_fast_size too), each built as
 * FrameDecoder._parse builds it; it stops at the first frame it does not take (incomplete,
 * over a limit, a value the C decoders give up on), which the Python loop then delivers or
 * names. */

static PyObject *frames_loop(PyObject *args, int cbor) {
    PyObject *data, *frames;
    Py_buffer buf;
    Py_ssize_t pos, max_payload, fast_size, cbor_fast_size = -1, max_items;
    int max_depth;
    if (cbor ? !PyArg_ParseTuple(args, "OnO!nnnin", &data, &pos, &PyList_Type, &frames,
                                 &max_payload, &fast_size, &cbor_fast_size, &max_depth,
                                 &max_items)
             : !PyArg_ParseTuple(args, "OnO!nnin", &data, &pos, &PyList_Type, &frames,
                                 &max_payload, &fast_size, &max_depth, &max_items))
        return NULL;
    if (!Atom_t || !Frame_t || max_depth > MAX_DEPTH || pos < 0) return PyLong_FromSsize_t(pos);
    if (PyObject_GetBuffer(data, &buf, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return PyLong_FromSsize_t(pos);
    }
    const unsigned char *p = buf.buf;
    Py_ssize_t end = buf.len;
    while (end - pos >= 16) {
        const unsigned char *h = p + pos;
        int is_cbor = h[3] & 0x80;
        if (h[0] != 'G' || h[1] != 'D' || h[2] != 2 || !frame_types[h[3] & 0x7f]) break;
        Py_ssize_t length = (Py_ssize_t)get_be(h + 4, 4);
        if (length > max_payload || length > (is_cbor ? cbor_fast_size : fast_size) ||
            end - pos - 16 < length)
            break;
        PyObject *payload;
        Py_ssize_t used = 0;
        if (length == 0) {
            payload = Py_NewRef(Py_None);
        } else if (is_cbor) {
            CborDec d = {h + 16, length, max_items};
            payload = cbor_decode_value(&d, &used, max_depth);
        } else {
            TlvDec d = {h + 16, length, 1, max_items};
            payload = tlv_decode_value(&d, &used, max_depth);
        }
        if (!payload) {
            PyErr_Clear();
            break;
        }
        if (length && used != length) {
            Py_DECREF(payload);
            break;
        }
        PyObject *request_id = PyLong_FromUnsignedLongLong(get_be(h + 8, 8));
        PyObject *fields[5] = {frame_types[h[3] & 0x7f], request_id, payload, version_2,
                               is_cbor ? codec_cbor : codec_tlv};
        PyObject *frame = request_id ? build(Frame_t, frame_descrs, fields, 5) : NULL;
        Py_XDECREF(request_id);
        Py_DECREF(payload);
        if (!frame || PyList_Append(frames, frame) < 0) {
            Py_XDECREF(frame);
            PyErr_Clear();
            break;
        }
        Py_DECREF(frame);
        pos += 16 + length;
    }
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(pos);
}

static PyObject *frames_v2(PyObject *self, PyObject *args) { return frames_loop(args, 1); }

/* ------------------------------------------------------------------------------------------ */
/* GD v1 raw frames (FrameBuffer.frames' scan, run on every read of the dirty pool's client,
 * node and workers): headers are checked, payloads are not decoded. */

/* Gunicorn's message types (MessageType below 0x20: what version 1 frames may carry). */
static int gd1_type(unsigned char t) { return (t >= 0x01 && t <= 0x05) || (t >= 0x10 && t <= 0x12); }

static PyObject *gd1_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t pos, end, max_payload;
    if (arg_count("gd1_scan", nargs, 4, 4) < 0 || arg_ssize(args[1], &pos) < 0 ||
        arg_ssize(args[2], &end) < 0 || arg_ssize(args[3], &max_payload) < 0)
        return NULL;
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *frames = NULL;
    if (pos < 0 || pos > end || end > buf.len || !(frames = PyList_New(0))) goto give_up;
    const unsigned char *p = buf.buf;
    while (end - pos >= 16) {
        const unsigned char *h = p + pos;
        if (h[0] != 'G' || h[1] != 'D' || h[2] != 1 || !gd1_type(h[3])) goto give_up;
        Py_ssize_t length = (Py_ssize_t)get_be(h + 4, 4);
        if (length > max_payload) goto give_up;
        Py_ssize_t stop = pos + 16 + length;
        if (stop > end) break;
        PyObject *frame = PyTuple_New(4);
        if (!frame) goto give_up;
        PyObject *fields[4] = {PyLong_FromLong(h[3]), PyLong_FromUnsignedLongLong(get_be(h + 8, 8)),
                               PyLong_FromSsize_t(pos + 16), PyLong_FromSsize_t(stop)};
        for (int i = 0; i < 4; i++) {
            if (!fields[i]) {
                for (int j = i; j < 4; j++) Py_XDECREF(fields[j]);
                Py_DECREF(frame);
                goto give_up;
            }
            PyTuple_SET_ITEM(frame, i, fields[i]);
        }
        int failed = PyList_Append(frames, frame) < 0;
        Py_DECREF(frame);
        if (failed) goto give_up;
        pos = stop;
    }
    /* The start of an incomplete header must be the magic's (as far as it has come). */
    if (pos < end && end - pos < 16 && (p[pos] != 'G' || (end - pos > 1 && p[pos + 1] != 'D')))
        goto give_up;
    PyBuffer_Release(&buf);
    return value_and_offset(frames, pos);
give_up:
    PyErr_Clear();
    Py_XDECREF(frames);
    PyBuffer_Release(&buf);
    Py_RETURN_NONE;
}

/* bytes.startswith(prefix, start, stop) of a bytes or bytearray buf, without startswith's
 * argument parsing (it builds a format string on every call): a dirty node comparing a REQUEST's
 * payload with the route bytes it read last (wire.opens_with). None where buf is not a bytes or
 * bytearray, prefix not a bytes, or a bound not an int (the Python path then answers). */
static PyObject *gd1_opens(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (arg_count("gd1_opens", nargs, 4, 4) < 0) return NULL;
    PyObject *buf = args[0], *prefix = args[3];
    if (!PyBytes_CheckExact(prefix) || !PyLong_CheckExact(args[1]) || !PyLong_CheckExact(args[2]))
        Py_RETURN_NONE;
    const char *data;
    Py_ssize_t len;
    if (PyByteArray_CheckExact(buf)) {
        data = PyByteArray_AS_STRING(buf);
        len = PyByteArray_GET_SIZE(buf);
    } else if (PyBytes_CheckExact(buf)) {
        data = PyBytes_AS_STRING(buf);
        len = PyBytes_GET_SIZE(buf);
    } else {
        Py_RETURN_NONE;
    }
    /* (NULL: an int past Py_ssize_t clamps, as a slice bound does) */
    Py_ssize_t start = PyNumber_AsSsize_t(args[1], NULL), stop = PyNumber_AsSsize_t(args[2], NULL);
    Py_ssize_t n = PyBytes_GET_SIZE(prefix);
    /* The slice bounds as bytes.startswith adjusts them (CPython's ADJUST_INDICES). */
    if (stop > len)
        stop = len;
    else if (stop < 0 && (stop += len) < 0)
        stop = 0;
    if (start < 0 && (start += len) < 0) start = 0;
    if (start > len - n || stop - start < n) Py_RETURN_FALSE;
    if (memcmp(data + start, PyBytes_AS_STRING(prefix), (size_t)n) != 0) Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}

/* A frame of a receive buffer, re-addressed, appended to a batch (a dirty node forwarding
 * requests to a worker and replies to a client: Batch.frame): dst += src[start - 16:stop], its
 * header's request id (bytes 8..16) then request_id. True; None (dst unchanged) where dst is not
 * a bytearray, src has no buffer, the range does not fit or the id is not a u64. */
static PyObject *gd1_readdress(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t start, stop;
    if (arg_count("gd1_readdress", nargs, 5, 5) < 0 || arg_ssize(args[2], &start) < 0 ||
        arg_ssize(args[3], &stop) < 0)
        return NULL;
    PyObject *dst = args[0];
    if (!PyByteArray_CheckExact(dst) || !PyLong_Check(args[4])) Py_RETURN_NONE;
    unsigned long long rid = PyLong_AsUnsignedLongLong(args[4]);
    if (rid == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(args[1], &buf, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (start < 16 || stop < start || stop > buf.len) {
        PyBuffer_Release(&buf);
        Py_RETURN_NONE;
    }
    Py_ssize_t size = PyByteArray_GET_SIZE(dst), n = stop - start + 16;
    if (PyByteArray_Resize(dst, size + n) < 0) {
        PyErr_Clear();
        PyBuffer_Release(&buf);
        Py_RETURN_NONE;
    }
    unsigned char *out = (unsigned char *)PyByteArray_AS_STRING(dst) + size;
    memcpy(out, (const unsigned char *)buf.buf + start - 16, (size_t)n);
    PyBuffer_Release(&buf);
    for (int i = 0; i < 8; i++) out[8 + i] = (unsigned char)(rid >> (56 - 8 * i));
    Py_RETURN_TRUE;
}

/* A whole GD v1 frame in one step (a dirty request or reply: wire.encode_dirty): its header,
 * then the version 1 TLV of ``payload``; None where tlv_encode gives None, or the payload would
 * exceed max_payload, or the type or request id is out of the header's range (the Python code
 * names what is wrong). */
static PyObject *gd1_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int mtype, max_depth;
    Py_ssize_t max_items, max_total, max_str, max_payload;
    if (arg_count("gd1_frame", nargs, 8, 8) < 0 || arg_int(args[0], &mtype) < 0 ||
        arg_int(args[3], &max_depth) < 0 || arg_ssize(args[4], &max_items) < 0 ||
        arg_ssize(args[5], &max_total) < 0 || arg_ssize(args[6], &max_str) < 0 ||
        arg_ssize(args[7], &max_payload) < 0)
        return NULL;
    if (!PyLong_Check(args[1])) Py_RETURN_NONE;
    unsigned long long rid = PyLong_AsUnsignedLongLong(args[1]);
    if (rid == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (!Atom_t || max_depth > MAX_DEPTH || mtype < 0 || mtype > 0xff || max_payload < 0 ||
        max_payload > 0xffffffffLL)
        Py_RETURN_NONE;
    TlvEnc e;
    out_init(&e.out, max_payload + 16);
    e.v2 = 0;
    e.max_items = max_items;
    e.max_total = max_total;
    e.max_str = max_str;
    e.total = 1;
    unsigned char header[16] = {'G', 'D', 1, (unsigned char)mtype};
    PyObject *result;
    if (out_write(&e.out, header, 16) < 0 || tlv_value(&e, args[2], max_depth) < 0 ||
        e.out.len - 16 > max_payload) {
        PyErr_Clear();
        result = Py_NewRef(Py_None);
    } else {
        put_be((unsigned char *)e.out.buf + 4, (unsigned long long)(e.out.len - 16), 4);
        put_be((unsigned char *)e.out.buf + 8, rid, 8);
        result = out_bytes(&e.out);
    }
    out_free(&e.out);
    return result;
}

/* A str value at *off, through the id cache (a request's app_path and action: the same few
 * names head every request, and the cached str keeps its hash, so the worker's lookups by them
 * hash nothing). */
static PyObject *tlv_cached_text(TlvDec *d, Py_ssize_t *off) {
    long long n = tlv_u32(d, *off);
    if (n < 0 || *off + 5 + n > d->end) return NULL;
    const unsigned char *p = d->p + *off;
    Py_ssize_t size = 5 + (Py_ssize_t)n;
    IdEntry *e = id_lookup(p, size);
    if (id_matches(e, p, size) && PyUnicode_CheckExact(e->value)) {
        *off += size;
        return Py_NewRef(e->value);
    }
    PyObject *text = tlv_decode_text(d, off, PY_SSIZE_T_MAX);
    if (text) id_store(e, p, size, text);
    return text;
}

/* The key at *off (a str) as one of a REQUEST's four: 0 app_path, 1 action, 2 args, 3 kwargs;
 * -1 for any other. */
static int request_key(TlvDec *d, Py_ssize_t *off) {
    static const char *names[4] = {"app_path", "action", "args", "kwargs"};
    if (*off >= d->end || d->p[*off] != 0x11) return -1;
    long long n = tlv_u32(d, *off);
    if (n < 0 || *off + 5 + n > d->end) return -1;
    const char *key = (const char *)d->p + *off + 5;
    for (int i = 0; i < 4; i++) {
        if ((size_t)n == strlen(names[i]) && memcmp(key, names[i], (size_t)n) == 0) {
            *off += 5 + n;
            return i;
        }
    }
    return -1;
}

/* A dirty REQUEST's payload, buffer[start:stop], decoded for a worker in one step: (app_path,
 * action, args, kwargs) when it is a version 1 TLV dict of exactly those four keys (in any
 * order), app_path and action str, args a list and kwargs a dict, as every client sends it;
 * None for anything else, or a payload past fast_size (the caller then decodes it its own way,
 * which names what is wrong). No dict of the payload is built, and app_path and action come
 * from the id cache. */
static PyObject *gd1_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int max_depth;
    Py_ssize_t max_items, fast_size, start, stop;
    if (arg_count("gd1_request", nargs, 6, 6) < 0 || arg_int(args[0], &max_depth) < 0 ||
        arg_ssize(args[1], &max_items) < 0 || arg_ssize(args[2], &fast_size) < 0 ||
        arg_ssize(args[4], &start) < 0 || arg_ssize(args[5], &stop) < 0)
        return NULL;
    if (!Atom_t || max_depth > MAX_DEPTH || max_depth < 2 || max_items < 4 || start < 0 ||
        stop < start || stop - start > fast_size)
        Py_RETURN_NONE;
    Py_buffer buf;
    if (PyObject_GetBuffer(args[3], &buf, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *fields[4] = {NULL, NULL, NULL, NULL};
    PyObject *result = NULL;
    TlvDec d = {(const unsigned char *)buf.buf, stop, 0, max_items};
    Py_ssize_t off = start;
    if (stop > buf.len || stop - start < 5 || d.p[off] != 0x21 || tlv_u32(&d, off) != 4)
        goto done;
    off += 5;
    for (int k = 0; k < 4; k++) {
        int i = request_key(&d, &off);
        if (i < 0 || fields[i] || off >= stop) goto done;
        unsigned char code = d.p[off];
        if (i < 2) {
            if (code != 0x11) goto done;
            fields[i] = tlv_cached_text(&d, &off);
        } else {
            if (code != (i == 2 ? 0x20 : 0x21)) goto done;
            fields[i] = tlv_decode_value(&d, &off, max_depth - 1);
        }
        if (!fields[i]) goto done;
    }
    if (off == stop) result = PyTuple_Pack(4, fields[0], fields[1], fields[2], fields[3]);
done:
    for (int i = 0; i < 4; i++) Py_XDECREF(fields[i]);
    PyBuffer_Release(&buf);
    if (!result) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return result;
}

/* ------------------------------------------------------------------------------------------ */

static PyObject *init(PyObject *self, PyObject *args) {
    PyObject *a, *p, *r, *x, *er, *ma, *mp, *mr;
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &a, &p, &r, &x, &er, &ma, &mp, &mr)) return NULL;
    PyObject **slots[] = {&Atom_t, &Pid_t, &Ref_t, &Exit_t, &Error_t, &make_atom, &make_pid,
                          &make_ref};
    PyObject *values[] = {a, p, r, x, er, ma, mp, mr};
    for (int i = 0; i < 8; i++) {
        Py_XDECREF(*slots[i]);
        *slots[i] = Py_NewRef(values[i]);
    }
    for (int i = 0; i < ID_CACHE_SIZE; i++) {
        Py_CLEAR(id_cache[i].key);
        Py_CLEAR(id_cache[i].value);
    }
    /* The slots' descriptors, if every one is a slot of the exact class (else the Python
     * constructors build the values). */
    PyObject *found[7];
    PyObject *classes[7] = {a, p, p, p, r, r, r};
    PyObject *fields[7] = {s_name, s_node, s_id, s_creation, s_node, s_id, s_creation};
    int ok = 1;
    for (int i = 0; i < 7; i++) {
        found[i] = NULL;
        if (!PyType_Check(classes[i])) {
            ok = 0;
            continue;
        }
        PyObject *descr = PyDict_GetItemWithError(((PyTypeObject *)classes[i])->tp_dict, fields[i]);
        if (!descr || Py_TYPE(descr) != &PyMemberDescr_Type) ok = 0;
        found[i] = descr;
    }
    PyErr_Clear();
    PyObject **targets[7] = {&d_atom_name, &d_pid[0], &d_pid[1], &d_pid[2],
                             &d_ref[0],    &d_ref[1], &d_ref[2]};
    for (int i = 0; i < 7; i++) {
        Py_XDECREF(*targets[i]);
        *targets[i] = ok ? Py_NewRef(found[i]) : NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"init", init, METH_VARARGS,
     "init(Atom, Pid, Ref, ExitReason, ErrorValue, make_atom, make_pid, make_ref)"},
    {"cbor_encode", cbor_encode, METH_VARARGS,
     "cbor_encode(value, max_depth, max_items, max_total_items, max_str[, max_payload]) -> "
     "bytes | None"},
    {"tlv_encode", (PyCFunction)(void (*)(void))tlv_encode, METH_FASTCALL,
     "tlv_encode(value, v2, max_depth, max_items, max_total_items, max_str[, max_payload]) -> "
     "bytes | None"},
    {"cbor_check", cbor_check, METH_O,
     "cbor_check(value) -> int | None: the NaNs a decoded value holds if it holds only wire's "
     "types, else None"},
    {"tlv_decode", (PyCFunction)(void (*)(void))tlv_decode, METH_FASTCALL,
     "tlv_decode(data, v2, max_depth, max_items) -> (value, end) | None"},
    {"frames_init", frames_init, METH_VARARGS,
     "frames_init(Frame, {code: MessageType}, Codec.TLV, Codec.CBOR): the class the frame loops"
     " build"},
    {"tlv_frames", tlv_frames, METH_VARARGS,
     "tlv_frames(data, pos, frames, max_payload, fast_size, max_depth, max_items) -> pos: "
     "appends the version 2 TLV frames from pos it takes whole; returns where it stopped"},
    {"frames_v2", frames_v2, METH_VARARGS,
     "frames_v2(data, pos, frames, max_payload, fast_size, cbor_fast_size, max_depth, "
     "max_items) -> pos: tlv_frames taking CBOR frames too"},
    {"gd1_scan", (PyCFunction)(void (*)(void))gd1_scan, METH_FASTCALL,
     "gd1_scan(buffer, pos, end, max_payload) -> ([(type, request_id, start, stop), ...], pos)"
     " | None: the complete GD v1 frames of buffer[pos:end] and where the rest starts; None if"
     " a header is bad"},
    {"gd1_frame", (PyCFunction)(void (*)(void))gd1_frame, METH_FASTCALL,
     "gd1_frame(type, request_id, payload, max_depth, max_items, max_total_items, max_str,"
     " max_payload) -> bytes | None: a GD v1 frame, its payload the version 1 TLV of payload"},
    {"gd1_opens", (PyCFunction)(void (*)(void))gd1_opens, METH_FASTCALL,
     "gd1_opens(buf, start, stop, prefix) -> bool | None: buf.startswith(prefix, start, stop)"},
    {"gd1_readdress", (PyCFunction)(void (*)(void))gd1_readdress, METH_FASTCALL,
     "gd1_readdress(dst, src, start, stop, request_id) -> True | None: dst (a bytearray) +="
     " src[start - 16:stop], a frame whose header then carries request_id"},
    {"gd1_request", (PyCFunction)(void (*)(void))gd1_request, METH_FASTCALL,
     "gd1_request(max_depth, max_items, fast_size, buffer, start, stop) -> (app_path, action,"
     " args, kwargs) | None: a dirty REQUEST's payload buffer[start:stop], decoded"},
    {"cbor_decode", cbor_decode, METH_VARARGS,
     "cbor_decode(data, max_depth, max_items) -> (value,) | None: the one value data holds"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "wire._speedups",
    "Optional C fast paths of wire's codecs; each returns None where the Python code must run.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    const char *names[] = {"name",   "node",    "id",      "creation", "kind",
                           "detail", "type",    "message", "details",  "traceback"};
    PyObject **slots[] = {&s_name,   &s_node,    &s_id,      &s_creation, &s_kind,
                          &s_detail, &s_type,    &s_message, &s_details,  &s_traceback};
    for (int i = 0; i < 10; i++) {
        *slots[i] = PyUnicode_InternFromString(names[i]);
        if (!*slots[i]) return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m && add_id_triple(m) < 0) Py_CLEAR(m);
    return m;
}

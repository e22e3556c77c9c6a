/* wire._speedups.IdTriple: the C base of otp's Pid and Ref (wire.IdTriple; the pure-Python
 * definition it must agree with is wire/_id_triple.py's class IdTriple).
 *
 * A runtime hashes its pids and refs many times per message (monitors, aliases, mailboxes keyed
 * by them): a __hash__ written in Python costs a frame each time (~400 instructions), this tp_hash
 * reads a field. Equality is the same three fields; ordering is left to the subclass.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *node;
    PyObject *id;
    PyObject *creation;
    Py_hash_t hash; /* -1 until first hashed */
} IdTriple;

static PyObject *id_triple_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    /* Arguments are the subclass's __init__'s to refuse (no public constructor). */
    IdTriple *self = (IdTriple *)type->tp_alloc(type, 0);
    if (self) self->hash = -1;
    return (PyObject *)self;
}

static void id_triple_dealloc(IdTriple *self) {
    Py_CLEAR(self->node);
    Py_CLEAR(self->id);
    Py_CLEAR(self->creation);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *missing(IdTriple *self) {
    return PyErr_Format(PyExc_AttributeError, "%s has no node, id and creation yet",
                        Py_TYPE(self)->tp_name);
}

static Py_hash_t id_triple_hash(IdTriple *self) {
    if (self->hash != -1) return self->hash;
    if (!self->node || !self->id || !self->creation) {
        missing(self);
        return -1;
    }
    /* hash((node, id, creation)), as the Python definition: the whole identity, since a peer
     * picks the ids it sends and a hash of the id alone would let it fill a dict with colliding
     * keys. */
    PyObject *key = PyTuple_Pack(3, self->node, self->id, self->creation);
    if (!key) return -1;
    Py_hash_t h = PyObject_Hash(key);
    Py_DECREF(key);
    if (h != -1) self->hash = h;
    return h;
}

static PyObject *id_triple_richcompare(PyObject *a, PyObject *b, int op) {
    if ((op != Py_EQ && op != Py_NE) || !PyObject_TypeCheck(b, Py_TYPE(a)))
        Py_RETURN_NOTIMPLEMENTED;
    int same = 1;
    if (a != b) {
        IdTriple *x = (IdTriple *)a, *y = (IdTriple *)b;
        if (!x->node || !x->id || !x->creation) return missing(x);
        if (!y->node || !y->id || !y->creation) return missing(y);
        same = PyObject_RichCompareBool(x->id, y->id, Py_EQ);
        if (same == 1) same = PyObject_RichCompareBool(x->node, y->node, Py_EQ);
        if (same == 1) same = PyObject_RichCompareBool(x->creation, y->creation, Py_EQ);
        if (same < 0) return NULL;
    }
    return PyBool_FromLong(op == Py_EQ ? same : !same);
}

static PyMemberDef id_triple_members[] = {
    {"node", T_OBJECT_EX, offsetof(IdTriple, node), 0, "The node's name."},
    {"id", T_OBJECT_EX, offsetof(IdTriple, id), 0, "The serial number on that node."},
    {"creation", T_OBJECT_EX, offsetof(IdTriple, creation), 0, "The node's incarnation."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject IdTripleType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wire.IdTriple",
    .tp_basicsize = sizeof(IdTriple),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A (node, id, creation) identity: equal and hashed by the three fields.",
    .tp_new = id_triple_new,
    .tp_dealloc = (destructor)id_triple_dealloc,
    .tp_hash = (hashfunc)id_triple_hash,
    .tp_richcompare = id_triple_richcompare,
    .tp_members = id_triple_members,
};

/* Adds IdTriple to the module; -1 on error. */
int add_id_triple(PyObject *module) {
    if (PyType_Ready(&IdTripleType) < 0) return -1;
    Py_INCREF(&IdTripleType);
    if (PyModule_AddObject(module, "IdTriple", (PyObject *)&IdTripleType) < 0) {
        Py_DECREF(&IdTripleType);
        return -1;
    }
    return 0;
}

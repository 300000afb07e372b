"""Calling generated C++ segments without ctypes: a tiny CPython extension, built once.

Why: a ctypes call converts every argument through its ``argtypes`` machinery, about
1 µs for a segment with seven pointers, which is a tenth of a small model's whole
compiled call. The extension here is generic (it knows nothing of any graph): a
``Kernel(address, nargs)`` object is called with Python ints (pointers from
``Tensor.data_ptr()`` and int64 sizes) through the vectorcall protocol, converts them
with ``PyLong_AsVoidPtr`` and calls the segment. It is compiled with gcc the first time
it is needed, stored in the disk cache like any generated library (keyed by its source,
the Python headers and the compiler), and shared by every graph of every process after.

Every call goes through one prototype of ``MAX_ARGS`` pointer-sized integers, the unused
tail zero. A segment takes only pointers and ``int64_t`` sizes, which the x86-64 and
AArch64 calling conventions pass in exactly the same registers and stack slots as
``intptr_t``, and a callee ignores arguments past its own (the caller owns the stack
area), so this is the call ctypes/libffi would make. One call site, not one per arity,
keeps the extension's one-time gcc run short. If the extension cannot be built (no compiler, no
Python headers), ``kernel`` returns None and the caller keeps ctypes: slower, same result.
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys
import sysconfig

from ...configuration import config
from . import extension

MAX_ARGS = 64          # segments with more arguments keep ctypes
_ABI_CHECKED = ("x86_64", "aarch64")     # where the calling convention argument below holds
_MODULE = "_tempa_fastcall"


def _source() -> str:
    params = ", ".join(["intptr_t"] * MAX_ARGS)
    args = ", ".join(f"a[{i}]" for i in range(MAX_ARGS))
    call = f"r = ((int (*)({params}))k->fn)({args});"
    return SOURCE_TEMPLATE.replace("@CALL@", call).replace("@MAX@", str(MAX_ARGS))


SOURCE_TEMPLATE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    void* fn;
    Py_ssize_t nargs;
} Kernel;

static PyObject* kernel_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
    Kernel* k = (Kernel*)self;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n != k->nargs || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_Format(PyExc_TypeError, "tempa kernel takes %zd positional arguments, got %zd", k->nargs, n);
        return NULL;
    }
    intptr_t a[@MAX@] = {0};
    for (Py_ssize_t i = 0; i < n; ++i) {
        a[i] = (intptr_t)PyLong_AsVoidPtr(args[i]);
        if (a[i] == 0 && PyErr_Occurred()) return NULL;
    }
    int r = 0;
    @CALL@
    return PyLong_FromLong(r);
}

static PyObject* kernel_new(PyTypeObject* type, PyObject* args, PyObject* kw) {
    PyObject* addr; Py_ssize_t nargs;
    if (!PyArg_ParseTuple(args, "On", &addr, &nargs)) return NULL;
    if (nargs < 0 || nargs > @MAX@) { PyErr_SetString(PyExc_ValueError, "nargs out of range"); return NULL; }
    void* fn = PyLong_AsVoidPtr(addr);
    if (!fn) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "null function"); return NULL; }
    Kernel* k = (Kernel*)type->tp_alloc(type, 0);
    if (!k) return NULL;
    k->vectorcall = kernel_call;
    k->fn = fn;
    k->nargs = nargs;
    return (PyObject*)k;
}

static PyTypeObject KernelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_tempa_fastcall.Kernel",
    .tp_basicsize = sizeof(Kernel),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Kernel, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = kernel_new,
    .tp_doc = "Kernel(address, nargs): calls a generated C++ segment with integer arguments",
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_tempa_fastcall", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__tempa_fastcall(void) {
    if (PyType_Ready(&KernelType) < 0) return NULL;
    PyObject* m = PyModule_Create(&moddef);
    if (!m) return NULL;
    Py_INCREF(&KernelType);
    if (PyModule_AddObject(m, "Kernel", (PyObject*)&KernelType) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
"""


def _compiler() -> str:
    from .build import BuildError, compiler_id
    try:
        return compiler_id(os.environ.get("CC") or "gcc")
    except BuildError:     # g++ compiles C too when told "-x c"
        return compiler_id(config.cxx)


def _build():
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"no Python.h under {include}")
    comp = _compiler()

    def command(src, so):
        return [comp.split("\n")[0], "-x", "c", "-O2", "-shared", "-fPIC", "-w", f"-I{include}",
                "-o", so, src]
    return extension.build_cached(_MODULE, "fastcall", _source(), "c",
                                  (sys.version, include, comp), command, timeout=120)


_extension = extension.BuiltOnce(_build, "fast kernel calls unavailable, using ctypes",
                                 "tempa-fastcall-build")


def module():
    """The loaded extension, or None where it cannot be built (said once, in the perf log)."""
    return _extension.get()


def prebuild() -> None:
    """Start building the extension in a background thread, so that on an empty cache its
    gcc run overlaps the graph's own (the first call waits for the longer of the two, not
    their sum). A no-op once built, loaded or started."""
    if config.fast_calls:
        _extension.prebuild()


def kernel(cfunc, nargs: int):
    """A faster callable for the ctypes function ``cfunc`` taking ``nargs`` integers, or None."""
    if nargs > MAX_ARGS or not config.fast_calls or platform.machine() not in _ABI_CHECKED:
        return None
    mod = module()
    if mod is None:
        return None
    return mod.Kernel(ctypes.cast(cfunc, ctypes.c_void_p).value, nargs)

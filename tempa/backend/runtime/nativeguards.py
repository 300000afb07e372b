"""An entry's tensor guards (and its emptiness checks) in one native call each: a tiny
extension, built once.

Why: a guard reads a tensor's metadata through Python attributes (``x.dtype``, ``x.shape``,
``x.is_contiguous()``, ...), each a torch call of 60-150 ns from Python, so a complete
check of one tensor costs 0.5-1 µs, and a small model's four parameters and its input are
half of its whole compiled call. The extension reads the same fields straight from the
``c10::TensorImpl`` (tens of ns for all of them). What it checks is defined by the Python
expressions of ``GuardSet.tensor_expression``: it evaluates exactly those, and where it
cannot read a field natively (custom sizes or strides, symbolic sizes: functorch wrappers,
nested tensors) it calls the entry's Python check for the same tensors, so the answer is
the Python expressions' answer on every tensor.

It includes only c10's ``TensorImpl.h`` (a full torch extension header set takes ~20 s to
compile; this ~2 s), and finds the ``TensorImpl*`` inside a tensor's Python object at the
offset where torch keeps it, which is probed at load against ``Tensor._cdata`` on several
kinds of tensors: if the probe fails (another torch layout), the extension is not used.
It is compiled with g++ the first time it is needed, stored in the disk cache (keyed by
its source, torch's version and headers, Python and the compiler), and shared by every
entry of every process after. Where it cannot be built (no compiler, no headers) or
``tempa.config.fast_guards`` is off, ``checker`` returns None and entries keep the Python
expressions: slower, same answers.
"""
from __future__ import annotations

import ctypes
import logging
import os
import sys
import sysconfig

import torch

from ...configuration import config
from . import extension

_MODULE = "_tempa_nativeguards"
# the only classes whose attribute reads are torch's own getters (no __torch_function__)
_NATIVE_TYPES = (torch.Tensor, torch.nn.Parameter)
_log = logging.getLogger("tempa.perf")
_reference: dict = {}  # (dtype, device) -> an empty tensor the extension reads them from

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <c10/core/TensorImpl.h>
#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <vector>

namespace {

Py_ssize_t impl_offset = -1;   // where a tensor's Python object holds its TensorImpl*

c10::TensorImpl* impl_of(PyObject* obj) {
    return *reinterpret_cast<c10::TensorImpl**>(reinterpret_cast<char*>(obj) + impl_offset);
}

struct Spec {
    PyTypeObject* type;
    caffe2::TypeMeta dtype;
    c10::Device device{c10::kCPU};
    bool cpu;                      // then only the device type is compared (``x.is_cpu``)
    std::vector<int64_t> sizes;    // -1: a dynamic dim, any size
    std::vector<int64_t> strides;  // empty: is_contiguous() instead
    bool requires_grad;
    bool argument;                 // then offset, conj, neg and inference too
    int64_t offset;
    int conj;                      // -1: not checked
    bool neg, inference;
};

// The Python expression's value, in its order; throws where a field has no native value.
bool matches(const Spec& s, c10::TensorImpl* t) {
    if (t->dtype() != s.dtype) return false;
    if (s.cpu ? !t->is_cpu() : t->device() != s.device) return false;
    c10::IntArrayRef sizes = t->sizes();
    if (sizes.size() != s.sizes.size()) return false;
    for (size_t d = 0; d < sizes.size(); ++d)
        if (s.sizes[d] >= 0 && sizes[d] != s.sizes[d]) return false;
    if (s.strides.empty()) {
        if (!t->is_contiguous()) return false;
    } else {
        c10::IntArrayRef strides = t->strides();
        if (strides.size() != s.strides.size() ||
            std::memcmp(strides.data(), s.strides.data(), strides.size() * sizeof(int64_t)))
            return false;
    }
    if (t->requires_grad() != s.requires_grad) return false;
    if (!s.argument) return true;
    if (t->storage_offset() != s.offset) return false;
    if (s.conj >= 0 && t->is_conj() != (s.conj == 1)) return false;
    return t->is_neg() == s.neg && t->is_inference() == s.inference;
}

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    std::vector<Spec>* specs;
    PyObject* fallback;            // the Python check of the same tensors
} TensorCheck;

PyObject* check_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
    TensorCheck* c = reinterpret_cast<TensorCheck*>(self);
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n != (Py_ssize_t)c->specs->size() || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_Format(PyExc_TypeError, "tensor check takes %zd tensors, got %zd",
                     (Py_ssize_t)c->specs->size(), n);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
        const Spec& s = (*c->specs)[i];
        if (Py_TYPE(args[i]) != s.type) Py_RETURN_FALSE;
        c10::TensorImpl* t = impl_of(args[i]);
        bool native = t != nullptr;
        bool ok = false;
        if (native) {
            try {
                ok = matches(s, t);
            } catch (...) {
                native = false;
            }
        }
        if (!native) return PyObject_Vectorcall(c->fallback, args, n, NULL);
        if (!ok) Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

bool read_ints(PyObject* seq, std::vector<int64_t>& out) {
    PyObject* fast = PySequence_Fast(seq, "expected a tuple of ints");
    if (!fast) return false;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    for (Py_ssize_t i = 0; i < n; ++i) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (v == -1 && PyErr_Occurred()) { Py_DECREF(fast); return false; }
        out.push_back(v);
    }
    Py_DECREF(fast);
    return true;
}

void check_dealloc(PyObject* self) {
    TensorCheck* c = reinterpret_cast<TensorCheck*>(self);
    PyObject_GC_UnTrack(self);
    Py_CLEAR(c->fallback);
    if (c->specs) {
        for (Spec& s : *c->specs) Py_DECREF(reinterpret_cast<PyObject*>(s.type));
        delete c->specs;
    }
    Py_TYPE(self)->tp_free(self);
}

int check_traverse(PyObject* self, visitproc visit, void* arg) {
    Py_VISIT(reinterpret_cast<TensorCheck*>(self)->fallback);
    return 0;
}

int check_clear(PyObject* self) {
    Py_CLEAR(reinterpret_cast<TensorCheck*>(self)->fallback);
    return 0;
}

PyObject* check_new(PyTypeObject* type, PyObject* args, PyObject* kw);

PyTypeObject TensorCheckType = {
    PyVarObject_HEAD_INIT(NULL, 0)
};

// TensorCheck(fallback, specs): each spec (type, reference, sizes, strides or None,
// requires_grad, argument, offset, conj, neg, inference), the reference an empty tensor
// of the spec's dtype and device.
PyObject* check_new(PyTypeObject* type, PyObject* args, PyObject* kw) {
    PyObject *fallback, *specs;
    if (impl_offset < 0) { PyErr_SetString(PyExc_RuntimeError, "layout not configured"); return NULL; }
    if (!PyArg_ParseTuple(args, "OO!", &fallback, &PyList_Type, &specs)) return NULL;
    auto parsed = new std::vector<Spec>();
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(specs); ++i) {
        PyObject *cls, *ref, *sizes, *strides;
        int requires_grad, argument, conj, neg, inference;
        long long offset;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(specs, i), "O!OOOppLipp", &PyType_Type, &cls, &ref,
                              &sizes, &strides, &requires_grad, &argument, &offset, &conj, &neg,
                              &inference)) {
            for (Spec& s : *parsed) Py_DECREF(reinterpret_cast<PyObject*>(s.type));
            delete parsed;
            return NULL;
        }
        Spec s;
        s.type = reinterpret_cast<PyTypeObject*>(cls);
        c10::TensorImpl* r = impl_of(ref);
        s.dtype = r->dtype();
        s.device = r->device();
        s.cpu = s.device.is_cpu();
        s.requires_grad = requires_grad;
        s.argument = argument;
        s.offset = offset;
        s.conj = conj;
        s.neg = neg;
        s.inference = inference;
        if (!read_ints(sizes, s.sizes) || (strides != Py_None && !read_ints(strides, s.strides))) {
            for (Spec& q : *parsed) Py_DECREF(reinterpret_cast<PyObject*>(q.type));
            delete parsed;
            return NULL;
        }
        Py_INCREF(cls);
        parsed->push_back(std::move(s));
    }
    TensorCheck* c = reinterpret_cast<TensorCheck*>(type->tp_alloc(type, 0));
    if (!c) {
        for (Spec& s : *parsed) Py_DECREF(reinterpret_cast<PyObject*>(s.type));
        delete parsed;
        return NULL;
    }
    c->vectorcall = check_call;
    c->specs = parsed;
    Py_INCREF(fallback);
    c->fallback = fallback;
    return reinterpret_cast<PyObject*>(c);
}

PyTypeObject* plain_types[2] = {NULL, NULL};   // torch.Tensor, torch.nn.Parameter

// configure(offset, tensor_type, parameter_type)
PyObject* configure(PyObject*, PyObject* args) {
    Py_ssize_t offset;
    PyObject *tensor_type, *parameter_type;
    if (!PyArg_ParseTuple(args, "nO!O!", &offset, &PyType_Type, &tensor_type, &PyType_Type,
                          &parameter_type)) return NULL;
    impl_offset = offset;
    Py_INCREF(tensor_type);
    Py_INCREF(parameter_type);
    plain_types[0] = reinterpret_cast<PyTypeObject*>(tensor_type);
    plain_types[1] = reinterpret_cast<PyTypeObject*>(parameter_type);
    Py_RETURN_NONE;
}

struct StorageKey {
    const void* data;              // the storage's data, or the tensor object itself
    c10::Device device;
    bool object;                   // a tensor with no storage, or an empty one: its identity
    bool operator==(const StorageKey& o) const {
        return data == o.data && device == o.device && object == o.object;
    }
};

struct StorageKeyHash {
    size_t operator()(const StorageKey& k) const {
        return std::hash<const void*>()(k.data) ^ (std::hash<int>()(int(k.device.type())) << 1) ^
               (std::hash<int>()(k.device.index()) << 9) ^ size_t(k.object);
    }
};

// The group of each tensor (the index of the first sharing its storage), or false where
// one cannot be read natively: not a plain tensor or parameter, no CPU or CUDA storage.
bool native_groups(PyObject* const* tensors, Py_ssize_t n, std::vector<long>& groups) {
    // a linear scan for the usual few dozen tensors (no allocation per tensor), a map past that
    const bool scan = n <= 96;
    std::vector<std::pair<StorageKey, long>> seen;
    std::unordered_map<StorageKey, long, StorageKeyHash> first;
    if (scan) seen.reserve(n);
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyTypeObject* type = Py_TYPE(tensors[i]);
        if (type != plain_types[0] && type != plain_types[1]) return false;
        c10::TensorImpl* t = impl_of(tensors[i]);
        if (t == nullptr) return false;
        long group = i;
        try {
            // no storage (functorch's batched tensors) or an empty one: only the same
            // tensor object aliases it, as the Python function's ``id(t)``
            StorageKey key{tensors[i], c10::Device(c10::kCPU), true};
            if (t->has_storage() && t->storage().nbytes() > 0) {
                c10::Device device = t->device();
                if (!device.is_cpu() && !device.is_cuda()) return false;
                key = StorageKey{t->storage().data(), device, false};
            }
            if (scan) {
                auto same = std::find_if(seen.begin(), seen.end(),
                                         [&](const auto& kv) { return kv.first == key; });
                if (same != seen.end()) group = same->second;
                else seen.emplace_back(key, i);
            } else {
                group = first.emplace(key, i).first->second;
            }
        } catch (...) {
            return false;
        }
        groups.push_back(group);
    }
    return true;
}

// storage_groups(fallback, *tensors): ``fallback(*tensors)`` (guards.storage_groups: which
// tensors share storage), read natively where every tensor is a plain one with CPU or CUDA
// storage, else by calling fallback: the same tuple either way.
PyObject* storage_groups(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (n < 1) {
        PyErr_SetString(PyExc_TypeError, "storage_groups(fallback, *tensors)");
        return NULL;
    }
    std::vector<long> groups;
    groups.reserve(n - 1);
    if (!native_groups(args + 1, n - 1, groups)) return PyObject_Vectorcall(args[0], args + 1, n - 1, NULL);
    PyObject* out = PyTuple_New(n - 1);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n - 1; ++i) {
        PyObject* v = PyLong_FromLong(groups[i]);
        if (!v) { Py_DECREF(out); return NULL; }
        PyTuple_SET_ITEM(out, i, v);
    }
    return out;
}

// all_empty(*objects): ``not (o1 or o2 or ...)``, the same truth tests in the same order
PyObject* all_empty(PyObject*, PyObject* const* args, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; ++i) {
        int truth = PyObject_IsTrue(args[i]);
        if (truth < 0) return NULL;
        if (truth) Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

// The keys of the hook tables OptimizedModule.__call__ reads, interned at load.
PyObject* wrapper_keys[3];     // the wrapper's: _forward_hooks, _forward_pre_hooks, _tempa_hooked
PyObject* module_keys[4];      // the module's: _forward_hooks, _forward_pre_hooks, _backward_hooks, _backward_pre_hooks

// each ``d[key]`` falsy; a missing key raises KeyError, as ``d[key]`` does
int entries_empty(PyObject* d, PyObject* const* keys, int n) {
    for (int i = 0; i < n; ++i) {
        PyObject* v = PyDict_GetItemWithError(d, keys[i]);
        if (v == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, keys[i]);
            return -1;
        }
        int truth = PyObject_IsTrue(v);
        if (truth != 0) return truth < 0 ? -1 : 0;
    }
    return 1;
}

// hooks_clear(wrapper_dict, module): OptimizedModule.__call__'s test for its fast path,
// ``not (w["_forward_hooks"] or w["_forward_pre_hooks"] or w["_tempa_hooked"] or
// m["_forward_hooks"] or m["_forward_pre_hooks"] or m["_backward_hooks"] or
// m["_backward_pre_hooks"])`` with m the module's current instance dict: the same truth
// tests in one call.
PyObject* hooks_clear(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (n != 2 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "hooks_clear(wrapper_dict, module)");
        return NULL;
    }
    PyObject** slot = _PyObject_GetDictPtr(args[1]);
    if (slot == NULL || *slot == NULL || !PyDict_Check(*slot)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "hooks_clear: the module has no instance dict");
        return NULL;
    }
    int clear = entries_empty(args[0], wrapper_keys, 3);
    if (clear == 1) clear = entries_empty(*slot, module_keys, 4);
    if (clear < 0) return NULL;
    return PyBool_FromLong(clear);
}

// The version tag a guard group depends on, by kind: 'd' a dict's (changes on every write
// to it), 't' a class's (reset, then assigned anew, when it or a base class is modified),
// 'o' the current instance dict's of an object, 'c' its current class's, 'i' (for a pair
// (dict, key)) the current one's of the dict at that key; 0 where there is none.
// 'g' (for a pair (object, name)) the current one's of the dict object.__getattribute__ finds
// there, from the instance dict or the class without running code. Tags are unique in the process: another dict or class never has the tag recorded.
// Read from CPython's own structs: 3.11 to 3.13 keep both tags (3.14 dropped the dict's).
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000
uint64_t dict_version(PyObject* d) {
    return PyDict_Check(d) ? reinterpret_cast<PyDictObject*>(d)->ma_version_tag : 0;
}

uint64_t type_version(PyTypeObject* t) {
#ifdef Py_TPFLAGS_VALID_VERSION_TAG
    if (!(t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) return 0;
#endif
    return t->tp_version_tag;
}

uint64_t version_of(PyObject* o, char kind) {
    switch (kind) {
    case 'd': return dict_version(o);
    case 't': return PyType_Check(o) ? type_version(reinterpret_cast<PyTypeObject*>(o)) : 0;
    case 'c': return type_version(Py_TYPE(o));
    case 'i': {    // (dict, key): the dict found at that key now
        if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 2 || !PyDict_Check(PyTuple_GET_ITEM(o, 0))) return 0;
        PyObject* inner = PyDict_GetItemWithError(PyTuple_GET_ITEM(o, 0), PyTuple_GET_ITEM(o, 1));
        if (inner == NULL) { PyErr_Clear(); return 0; }
        return dict_version(inner);
    }
    case 'o': {
        PyObject** slot = _PyObject_GetDictPtr(o);
        if (slot == NULL) { PyErr_Clear(); return 0; }
        return *slot == NULL ? 0 : dict_version(*slot);
    }
    case 'g': {    // (object, name): the dict object.__getattribute__ finds there, read
                   // without running code (0 where a data descriptor of the class decides)
        if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(o, 1))) return 0;
        PyObject* obj = PyTuple_GET_ITEM(o, 0);
        PyObject* name = PyTuple_GET_ITEM(o, 1);
        PyObject* found = _PyType_Lookup(Py_TYPE(obj), name);
        if (found != NULL && Py_TYPE(found)->tp_descr_set != NULL) return 0;
        PyObject** slot = _PyObject_GetDictPtr(obj);
        if (slot == NULL) PyErr_Clear();
        else if (*slot != NULL && PyDict_Check(*slot)) {
            PyObject* own = PyDict_GetItemWithError(*slot, name);
            if (own != NULL) return dict_version(own);
            if (PyErr_Occurred()) { PyErr_Clear(); return 0; }
        }
        return found == NULL ? 0 : dict_version(found);
    }
    }
    return 0;
}
#endif

// versions_changed(roots, kinds, seen): 0 where every root's version tag is the one in
// ``seen`` (a bytearray, 8 bytes a root), else an int whose bit i says root i changed (or
// has no tag), in ceil(n / 64) words of 64 bits, followed by the tags read now (8 bytes a
// root, in order), for the entry to store into ``seen`` once the changed roots' guards held.
PyObject* versions_changed(PyObject*, PyObject* const* args, Py_ssize_t n) {
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000
    if (n != 3 || !PyTuple_Check(args[0]) || !PyBytes_Check(args[1]) || !PyByteArray_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "versions_changed(roots, kinds, seen)");
        return NULL;
    }
    Py_ssize_t k = PyTuple_GET_SIZE(args[0]);
    if (PyBytes_GET_SIZE(args[1]) != k || PyByteArray_GET_SIZE(args[2]) != 8 * k) {
        PyErr_SetString(PyExc_ValueError, "versions_changed: one kind and 8 bytes of seen a root");
        return NULL;
    }
    const char* kinds = PyBytes_AS_STRING(args[1]);
    const char* seen = PyByteArray_AS_STRING(args[2]);
    Py_ssize_t words = (k + 63) / 64;
    std::vector<uint64_t> out(words + k, 0);
    bool any = false;
    for (Py_ssize_t i = 0; i < k; ++i) {
        uint64_t v = version_of(PyTuple_GET_ITEM(args[0], i), kinds[i]);
        uint64_t was;
        std::memcpy(&was, seen + 8 * i, 8);
        out[words + i] = v;
        if (v == 0 || v != was) { out[i / 64] |= uint64_t(1) << (i % 64); any = true; }
    }
    if (!any) return PyLong_FromLong(0);
    std::vector<unsigned char> bytes(8 * out.size());
    for (size_t i = 0; i < out.size(); ++i)
        for (int b = 0; b < 8; ++b) bytes[8 * i + b] = static_cast<unsigned char>(out[i] >> (8 * b));
    return _PyLong_FromByteArray(bytes.data(), bytes.size(), 1, 0);
#else
    PyErr_SetString(PyExc_RuntimeError, "no version tags in this Python");
    return NULL;
#endif
}

PyMethodDef methods[] = {
    {"versions_changed", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(versions_changed)),
     METH_FASTCALL, "versions_changed(roots, kinds, seen): which roots changed, and their tags now"},
    {"configure", configure, METH_VARARGS,
     "configure(offset, Tensor, Parameter): where a tensor object holds its TensorImpl*, and the plain tensor types"},
    {"storage_groups", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(storage_groups)),
     METH_FASTCALL, "storage_groups(fallback, *tensors): which tensors share storage"},
    {"hooks_clear", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(hooks_clear)),
     METH_FASTCALL, "hooks_clear(wrapper_dict, module): no hooks on a compiled module's call"},
    {"all_empty", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(all_empty)),
     METH_FASTCALL, "all_empty(*objects): not (o1 or o2 or ...)"},
    {NULL, NULL, 0, NULL},
};

PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_tempa_nativeguards", NULL, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__tempa_nativeguards(void) {
    TensorCheckType.tp_name = "_tempa_nativeguards.TensorCheck";
    TensorCheckType.tp_basicsize = sizeof(TensorCheck);
    TensorCheckType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC;
    TensorCheckType.tp_vectorcall_offset = offsetof(TensorCheck, vectorcall);
    TensorCheckType.tp_call = PyVectorcall_Call;
    TensorCheckType.tp_new = check_new;
    TensorCheckType.tp_dealloc = check_dealloc;
    TensorCheckType.tp_traverse = check_traverse;
    TensorCheckType.tp_clear = check_clear;
    TensorCheckType.tp_doc = "TensorCheck(fallback, specs): an entry's tensor guards, natively";
    if (PyType_Ready(&TensorCheckType) < 0) return NULL;
    const char* wrapper_names[3] = {"_forward_hooks", "_forward_pre_hooks", "_tempa_hooked"};
    const char* module_names[4] = {"_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                                   "_backward_pre_hooks"};
    for (int i = 0; i < 3; ++i)
        if (!(wrapper_keys[i] = PyUnicode_InternFromString(wrapper_names[i]))) return NULL;
    for (int i = 0; i < 4; ++i)
        if (!(module_keys[i] = PyUnicode_InternFromString(module_names[i]))) return NULL;
    PyObject* m = PyModule_Create(&moddef);
    if (!m) return NULL;
    Py_INCREF(&TensorCheckType);
    if (PyModule_AddObject(m, "TensorCheck", reinterpret_cast<PyObject*>(&TensorCheckType)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
"""


def _torch_paths() -> tuple[str, str]:
    root = os.path.dirname(torch.__file__)
    return os.path.join(root, "include"), os.path.join(root, "lib")


def _build():
    py_include = sysconfig.get_paths()["include"]
    include, lib = _torch_paths()
    for header in (os.path.join(py_include, "Python.h"),
                   os.path.join(include, "c10", "core", "TensorImpl.h")):
        if not os.path.exists(header):
            raise RuntimeError(f"no {header}")
    from .build import compiler_id
    comp = compiler_id(config.cxx)
    with open(os.path.join(include, "c10", "core", "TensorImpl.h"), "rb") as f:
        header = f.read()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)

    def command(src, so):
        return [comp.split("\n")[0], "-O2", "-shared", "-fPIC", "-w", "-std=c++17",
                f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{py_include}", f"-I{include}",
                "-o", so, src, f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}"]
    mod = extension.build_cached(_MODULE, "nativeguards", SOURCE, "cpp",
                                 (sys.version, torch.__version__, header, py_include, include,
                                  comp), command, timeout=300)
    offset = _impl_offset()
    if offset is None:
        raise RuntimeError("cannot find the TensorImpl pointer inside a tensor object "
                           f"(torch {torch.__version__})")
    mod.configure(offset, *_NATIVE_TYPES)
    return mod


def _impl_offset() -> int | None:
    """Where this torch keeps a tensor's ``TensorImpl*`` in its Python object: the first
    pointer-aligned slot after the object header that holds ``_cdata`` for every probe (a
    plain tensor, a view, a parameter, an inference tensor, a subclass instance)."""
    class Probe(torch.Tensor):
        pass
    with torch.inference_mode():
        inference = torch.zeros(2)
    base = torch.zeros(3, 4)
    probes = [base, base[1:, ::2], torch.nn.Parameter(torch.ones(2)), inference,
              torch.zeros(1).as_subclass(Probe), torch.empty(0, dtype=torch.float64)]
    size = ctypes.sizeof(ctypes.c_void_p)
    for offset in range(object.__basicsize__, object.__basicsize__ + 4 * size, size):
        if all(ctypes.c_void_p.from_address(id(t) + offset).value == t._cdata for t in probes):
            return offset
    return None


_extension = extension.BuiltOnce(
    _build, "native tensor guards unavailable, using Python guards", "tempa-nativeguards-build")


def module():
    """The loaded extension, or None where it cannot be used (said once, in the perf log)."""
    return _extension.get()


def prebuild() -> None:
    """Start building the extension in a background thread (a no-op once started), so that
    on an empty cache its compiler run overlaps the first capture."""
    if config.fast_guards:
        _extension.prebuild()


def native(spec) -> bool:
    """Whether the extension can check a tensor of this ``TensorSpec``."""
    return spec.type in _NATIVE_TYPES


def checker(specs: list, fallback):
    """One callable checking tensors against ``specs`` (``TensorSpec``s, all ``native``):
    ``check(t0, t1, ...)`` is the conjunction of their Python checks, which ``fallback``
    (same arguments) evaluates where a tensor's fields cannot be read natively. None where
    the extension cannot be used."""
    if not config.fast_guards:
        return None
    mod = module()
    if mod is None:
        return None
    try:
        rows = [(s.type, _reference_tensor(s.dtype, s.device),
                 tuple(-1 if d in s.dynamic_dims else n for d, n in enumerate(s.shape)),
                 None if s.contiguous else s.stride, s.requires_grad, not s.attribute, s.offset,
                 -1 if s.conj is None else int(s.conj), s.neg, s.inference) for s in specs]
    except (RuntimeError, TypeError) as e:   # a device no empty tensor can be made on
        _log.info("native tensor guards not used for this entry: %s", e)
        return None
    return mod.TensorCheck(fallback, rows)


def all_empty():
    """``all_empty(*objects)``, natively ``not (o1 or o2 or ...)`` (hook dicts: one call
    for all of an entry's instead of a truth test each from Python); None where the
    extension cannot be used."""
    if not config.fast_guards:
        return None
    mod = module()
    return None if mod is None else mod.all_empty


def storage_groups():
    """``storage_groups(fallback, *tensors)``: ``fallback(*tensors)`` (guards'
    ``storage_groups``, which tensor arguments share storage), natively for plain CPU and
    CUDA tensors (an entry with a StaticCache's 32 cache tensors among its arguments: ~1 µs
    against ~40 from Python); None where the extension cannot be used."""
    if not config.fast_guards:
        return None
    mod = module()
    return None if mod is None else mod.storage_groups


def hooks_clear():
    """``hooks_clear(wrapper_dict, module)``: OptimizedModule.__call__'s seven hook-table
    truth tests in one call (its ``_hooks_clear`` is the Python definition); None where the
    extension cannot be used."""
    if not config.fast_guards:
        return None
    mod = module()
    return None if mod is None else mod.hooks_clear


def settled() -> bool:
    """Whether the extension's build has its answer (loaded, or unavailable) without waiting."""
    return _extension.settled()


def versions_changed():
    """``versions_changed(roots, kinds, seen)``, which of an entry's dicts and types (kinds
    ``d``/``t``) changed since their guards last held (capture/cache.py _versioned_groups);
    None where the extension cannot be used or this Python has no version tags (3.14)."""
    if not config.fast_guards or not (0x030B0000 <= sys.hexversion < 0x030E0000):
        return None
    mod = module()
    return None if mod is None else getattr(mod, "versions_changed", None)


def _reference_tensor(dtype, device):
    key = (dtype, device)
    ref = _reference.get(key)
    if ref is None:
        ref = _reference[key] = torch.empty(0, dtype=dtype, device=device)
    return ref

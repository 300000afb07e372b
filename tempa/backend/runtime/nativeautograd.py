"""The autograd node of a compiled training graph, natively: a small C++ extension over
torch's autograd headers, built once.

Why: ``autograd.Function.apply`` costs ~4.5 µs a call on the seed MLP (a Python ctx object,
``_backward_cls``, ``forward`` and ``setup_context`` looked up by name, the ``needs_input_grad``
tuple, input and output bookkeeping), a third of its whole compiled grad-mode call. Here one
call (``Function(...)(*inputs)``) collects the inputs' gradient edges, runs the compiled
forward (a Python callable) with grad mode off, sets the outputs' history through
``torch::autograd::_wrap_outputs`` (the function ``Function.apply`` itself uses: outputs that
are inputs become views of them, non-differentiable outputs get none) and keeps what the
backward needs in a ``torch::autograd::Node`` whose ``apply`` calls the Python backward. What
it does beyond ``Function`` as tempa used it, as eager does:

- the inputs the backward reads are version-checked: one modified in place before the backward
  raises eager's "modified by an inplace operation" error instead of a wrong gradient;
- its saved values are freed by a backward without ``retain_graph``, and a second backward
  then raises eager's "backward through the graph a second time" error.

Saved values that are also outputs are ``SavedVariable``s (a plain reference would be a
reference cycle through the output's ``grad_fn``, which no garbage collector sees in C++).
An output that gets no gradient (the loss did not use it) gets None in the Python backward,
which runs a backward compiled for that (autograd.py ``_AbsentTangents``); with
``materialize`` on, a zero tensor instead, as ``Function`` does by default.

It takes ~15-30 s of CPU to compile (torch's autograd and pybind11 headers), so it is built in
a background thread the first time a training graph is compiled and stored in the disk cache;
graphs compiled before it is ready, or where it cannot be built or loaded (no compiler, other
headers, a torch whose symbols differ: then the loader refuses it), use ``autograd.Function``:
the same answers, said once in the perf log. ``tempa.config.native_autograd`` off: always
``autograd.Function``.
"""
from __future__ import annotations

import functools
import os
import sys
import sysconfig

import torch

from ...configuration import config
from . import extension
from .nativeguards import _torch_paths   # the same torch include and lib folders

_MODULE = "_tempa_nativeautograd"

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Dtype.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/SmallVector.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/GradMode.h>
#include <functional>
#include <mutex>
#include <optional>
#include <unordered_set>
#include <vector>

namespace torch::autograd {
// custom_function.h's declaration (that header pulls in compiled autograd's, ~10 s more)
std::vector<std::optional<Variable>> _wrap_outputs(
    const variable_list& input_vars,
    const std::unordered_set<at::TensorImpl*>& non_differentiable,
    const std::unordered_set<at::TensorImpl*>& dirty_inputs,
    const at::ArrayRef<std::optional<Variable>> raw_outputs,
    const c10::intrusive_ptr<Node>& cdata,
    const std::function<variable_list(variable_list, variable_list)>& jvp_user_function,
    const std::unordered_set<at::TensorImpl*>& to_save_if_setup_context,
    const std::function<at::Tensor(at::Tensor)>& view_as_self_fn,
    bool pure_view);
}  // namespace torch::autograd

namespace {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::Variable;
using torch::autograd::variable_list;

struct Gil {
    PyGILState_STATE state = PyGILState_Ensure();
    ~Gil() { PyGILState_Release(state); }
};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject* fw_call;
    PyObject* backward;
    Py_ssize_t n_in, n_out, n_saved;
    std::vector<bool>* differentiable;   // per user output
    std::vector<Py_ssize_t>* checked;    // inputs the backward reads: version-checked
    std::vector<Py_ssize_t>* alias;      // per saved value: the user output it is, or -1
    bool single;
    bool materialize;                    // zeros, not None, for an output without a gradient
} Spec;

struct TempaNode : Node {
    TempaNode(PyObject* spec, torch::autograd::edge_list&& edges) : Node(std::move(edges)), spec_(spec) {
        Py_INCREF(spec_);
    }
    ~TempaNode() override {
        if (Py_IsInitialized()) {
            Gil gil;
            clear();
            Py_DECREF(spec_);
        }
    }
    std::string name() const override { return "TempaCompiledFunctionBackward"; }
    variable_list apply(variable_list&& grads) override;
    void release_variables() override {
        std::lock_guard<std::mutex> lock(mutex_);
        Gil gil;
        clear();
        released_ = true;
    }
    void clear() {     // with the GIL: the tensors' last references may free Python objects
        inputs_.clear();
        saved_.clear();
        saved_outputs_.clear();
        Py_CLEAR(other_inputs_);
    }
    PyObject* held();

    PyObject* spec_;
    // every input (the recompute of a double backward reads them all): tensors as tensors,
    // no Python tuple a call (each tuple made would count towards the garbage collector)
    c10::SmallVector<at::Tensor, 8> inputs_;
    PyObject* other_inputs_ = nullptr;              // all inputs, where some are no tensors
    c10::SmallVector<uint32_t, 8> versions_;        // of Spec::checked, at the forward
    c10::SmallVector<at::Tensor, 4> saved_;         // saved values (undefined: in saved_outputs_)
    // saved values that are user outputs, in order (a plain reference would be a cycle
    // through the output's grad_fn, which no garbage collector sees in C++)
    std::vector<SavedVariable> saved_outputs_;
    bool released_ = false;
};

const std::unordered_set<at::TensorImpl*> kNone;
const std::function<variable_list(variable_list, variable_list)> kNoJvp =
    [](variable_list, variable_list) -> variable_list {
        TORCH_CHECK(false, "tempa: forward-mode AD through the native autograd node");
    };
const std::function<at::Tensor(at::Tensor)> kViewAsSelf = [](at::Tensor x) { return x.view_as(x); };

PyObject* wrap_or_none(const at::Tensor& t) {
    if (t.defined()) return THPVariable_Wrap(t);
    Py_INCREF(Py_None);
    return Py_None;
}

// (inputs..., saved values...): what the Python backward reads
PyObject* TempaNode::held() {
    Spec* s = reinterpret_cast<Spec*>(spec_);
    Py_ssize_t n_in = s->n_in;
    THPObjectPtr held(PyTuple_New(n_in + s->n_saved));
    if (!held) return NULL;
    for (Py_ssize_t i = 0; i < n_in; ++i) {
        PyObject* o;
        if (other_inputs_) {
            o = PyTuple_GET_ITEM(other_inputs_, i);
            Py_INCREF(o);
        } else {
            o = THPVariable_Wrap(inputs_[i]);
            if (!o) return NULL;
        }
        PyTuple_SET_ITEM(held.get(), i, o);
    }
    size_t next_output = 0;
    for (Py_ssize_t k = 0; k < s->n_saved; ++k) {
        PyObject* o = saved_[k].defined() ? wrap_or_none(saved_[k])
                                          : wrap_or_none(saved_outputs_[next_output++].unpack(getptr()));
        if (!o) return NULL;
        PyTuple_SET_ITEM(held.get(), n_in + k, o);
    }
    return held.release();
}

variable_list TempaNode::apply(variable_list&& grads) {
    std::lock_guard<std::mutex> lock(mutex_);
    Gil gil;
    TORCH_CHECK(!released_,
        "Trying to backward through the graph a second time (or directly access saved tensors "
        "after they have already been freed). Saved intermediate values of the graph are freed "
        "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
        "backward through the graph a second time or if you need to access saved tensors after "
        "calling backward.");
    Spec* s = reinterpret_cast<Spec*>(spec_);
    for (size_t k = 0; k < s->checked->size(); ++k) {
        const at::Tensor& t = inputs_[(*s->checked)[k]];
        if (!t.defined()) continue;
        uint32_t now = t._version();
        TORCH_CHECK(now == versions_[k],
            "one of the variables needed for gradient computation has been modified by an "
            "inplace operation: [", t.toString(), " ", t.sizes(), "] is at version ", now,
            "; expected version ", versions_[k], " instead. Hint: enable anomaly detection to "
            "find the operation that failed to compute its gradient, with "
            "torch.autograd.set_detect_anomaly(True).");
    }
    THPObjectPtr held_values(held());
    if (!held_values) throw python_error();
    THPObjectPtr py_grads(PyTuple_New(grads.size()));
    if (!py_grads) throw python_error();
    for (size_t i = 0; i < grads.size(); ++i) {
        PyObject* g;
        if (grads[i].defined()) {
            g = THPVariable_Wrap(grads[i]);
        } else if (s->materialize && (*s->differentiable)[i]) {
            g = THPVariable_Wrap(input_metadata(i).zeros_like());   // materialize_grads
        } else {
            Py_INCREF(Py_None);
            g = Py_None;
        }
        if (!g) throw python_error();
        PyTuple_SET_ITEM(py_grads.get(), i, g);
    }
    THPObjectPtr res(PyObject_CallFunctionObjArgs(s->backward, held_values.get(), py_grads.get(), NULL));
    if (!res) throw python_error();
    TORCH_CHECK(PyTuple_Check(res.get()) && PyTuple_GET_SIZE(res.get()) == s->n_in,
                "tempa: the compiled backward returned the wrong number of gradients");
    variable_list out(s->n_in);
    for (Py_ssize_t i = 0; i < s->n_in; ++i) {
        PyObject* g = PyTuple_GET_ITEM(res.get(), i);
        if (g != Py_None && next_edge(i).is_valid()) out[i] = THPVariable_Unpack(g);
    }
    return out;
}

// Whether every output is a new tensor without autograd state (not an input, not a view):
// then setting its history is what _wrap_outputs would do, without its bookkeeping.
bool all_fresh(const std::vector<std::optional<Variable>>& outs, const variable_list& inputs) {
    for (const auto& o : outs) {
        if (!o.has_value()) return false;
        at::TensorImpl* impl = o->unsafeGetTensorImpl();
        if (impl->autograd_meta() != nullptr || o->is_view()) return false;
        for (const auto& in : inputs)
            if (in.defined() && in.unsafeGetTensorImpl() == impl) return false;
    }
    return true;
}

PyObject* spec_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
    HANDLE_TH_ERRORS
    Spec* s = reinterpret_cast<Spec*>(self);
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n != s->n_in || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_Format(PyExc_TypeError, "tempa compiled function takes %zd arguments, got %zd", s->n_in, n);
        return NULL;
    }
    variable_list inputs;
    inputs.reserve(n);
    bool any_requires_grad = false, all_tensors = true;
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (THPVariable_Check(args[i])) {
            inputs.push_back(THPVariable_Unpack(args[i]));
            any_requires_grad |= inputs.back().requires_grad();
        } else {
            inputs.emplace_back();
            all_tensors = false;
        }
    }
    c10::intrusive_ptr<TempaNode> node;
    if (c10::GradMode::is_enabled() && any_requires_grad)
        node = c10::make_intrusive<TempaNode>(self, torch::autograd::collect_next_edges(inputs));
    THPObjectPtr r;
    {
        c10::AutoGradMode no_grad(false);
        c10::AutoFwGradMode no_fw_grad(false);
        r = PyObject_Vectorcall(s->fw_call, args, n, NULL);
    }
    if (!r) return NULL;
    r = PySequence_Fast(r.get(), "tempa: the compiled forward returned no sequence");
    if (!r) return NULL;
    if (PySequence_Fast_GET_SIZE(r.get()) != s->n_out + s->n_saved) {
        PyErr_SetString(PyExc_RuntimeError, "tempa: the compiled forward returned an unexpected result");
        return NULL;
    }
    PyObject** items = PySequence_Fast_ITEMS(r.get());
    std::vector<std::optional<Variable>> outs(s->n_out);
    for (Py_ssize_t i = 0; i < s->n_out; ++i)
        if (THPVariable_Check(items[i])) outs[i] = THPVariable_Unpack(items[i]);
    std::vector<std::optional<Variable>> wrapped;
    if (node && all_fresh(outs, inputs)) {
        for (Py_ssize_t i = 0; i < s->n_out; ++i) {
            const Variable& v = *outs[i];
            if ((*s->differentiable)[i] && torch::autograd::isDifferentiableType(v.scalar_type()))
                torch::autograd::impl::set_gradient_edge(v, {node, node->add_input_metadata(v)});
            else
                node->add_input_metadata(Node::undefined_input());
        }
    } else {
        std::unordered_set<at::TensorImpl*> non_differentiable;
        for (Py_ssize_t i = 0; i < s->n_out; ++i)
            if (outs[i].has_value() && !(*s->differentiable)[i])
                non_differentiable.insert(outs[i]->unsafeGetTensorImpl());
        c10::intrusive_ptr<Node> cdata = node;
        wrapped = torch::autograd::_wrap_outputs(inputs, non_differentiable, kNone, outs, cdata,
                                                 kNoJvp, kNone, kViewAsSelf, false);
    }
    // the output objects: the forward's own, or a new one where _wrap_outputs made a view
    auto result = [&](Py_ssize_t i) -> PyObject* {
        if (wrapped.empty() || !wrapped[i].has_value() ||
            wrapped[i]->unsafeGetTensorImpl() == outs[i]->unsafeGetTensorImpl()) {
            Py_INCREF(items[i]);
            return items[i];
        }
        return THPVariable_Wrap(*wrapped[i]);
    };
    const auto& final_outs = wrapped.empty() ? outs : wrapped;
    if (node) {
        node->inputs_.assign(inputs.begin(), inputs.end());
        if (!all_tensors) {
            node->other_inputs_ = PyTuple_New(n);
            if (!node->other_inputs_) return NULL;
            for (Py_ssize_t i = 0; i < n; ++i) {
                Py_INCREF(args[i]);
                PyTuple_SET_ITEM(node->other_inputs_, i, args[i]);
            }
        }
        for (Py_ssize_t i : *s->checked)
            node->versions_.push_back(inputs[i].defined() ? inputs[i]._version() : 0);
        node->saved_.resize(s->n_saved);
        for (Py_ssize_t k = 0; k < s->n_saved; ++k) {
            Py_ssize_t a = (*s->alias)[k];
            PyObject* item = items[s->n_out + k];
            if (a < 0 && THPVariable_Check(item)) {
                // the same tensor as an output, although another value of the graph
                at::TensorImpl* impl = THPVariable_Unpack(item).unsafeGetTensorImpl();
                for (Py_ssize_t i = 0; i < s->n_out && a < 0; ++i)
                    if (final_outs[i].has_value() && final_outs[i]->unsafeGetTensorImpl() == impl) a = i;
            }
            if (a >= 0) {
                node->saved_outputs_.emplace_back(*final_outs[a], true);
            } else if (THPVariable_Check(item)) {
                node->saved_[k] = THPVariable_Unpack(item);
            } else {
                PyErr_SetString(PyExc_RuntimeError, "tempa: a saved value is no tensor");
                return NULL;
            }
        }
    }
    if (s->single) return result(0);
    THPObjectPtr tuple(PyTuple_New(s->n_out));
    if (!tuple) return NULL;
    for (Py_ssize_t i = 0; i < s->n_out; ++i) {
        PyObject* o = result(i);
        if (!o) return NULL;
        PyTuple_SET_ITEM(tuple.get(), i, o);
    }
    return tuple.release();
    END_HANDLE_TH_ERRORS
}

bool read_indices(PyObject* seq, std::vector<Py_ssize_t>& out) {
    PyObject* fast = PySequence_Fast(seq, "expected a tuple of ints");
    if (!fast) return false;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
        Py_ssize_t v = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, i));
        if (v == -1 && PyErr_Occurred()) { Py_DECREF(fast); return false; }
        out.push_back(v);
    }
    Py_DECREF(fast);
    return true;
}

void spec_dealloc(PyObject* self) {
    Spec* s = reinterpret_cast<Spec*>(self);
    PyObject_GC_UnTrack(self);
    Py_CLEAR(s->fw_call);
    Py_CLEAR(s->backward);
    delete s->differentiable;
    delete s->checked;
    delete s->alias;
    Py_TYPE(self)->tp_free(self);
}

int spec_traverse(PyObject* self, visitproc visit, void* arg) {
    Spec* s = reinterpret_cast<Spec*>(self);
    Py_VISIT(s->fw_call);
    Py_VISIT(s->backward);
    return 0;
}

int spec_clear(PyObject* self) {
    Spec* s = reinterpret_cast<Spec*>(self);
    Py_CLEAR(s->fw_call);
    Py_CLEAR(s->backward);
    return 0;
}

// Function(fw_call, backward, n_in, n_out, differentiable outputs, checked inputs, alias, single,
//          materialize)
PyObject* spec_new(PyTypeObject* type, PyObject* args, PyObject* kw) {
    PyObject *fw_call, *backward, *diff, *checked, *alias;
    Py_ssize_t n_in, n_out;
    int single, materialize;
    if (!PyArg_ParseTuple(args, "OOnnOOOpp", &fw_call, &backward, &n_in, &n_out, &diff, &checked,
                          &alias, &single, &materialize))
        return NULL;
    std::vector<Py_ssize_t> d, c, a;
    if (!read_indices(diff, d) || !read_indices(checked, c) || !read_indices(alias, a)) return NULL;
    for (Py_ssize_t i : c) if (i < 0 || i >= n_in) { PyErr_SetString(PyExc_ValueError, "bad input index"); return NULL; }
    for (Py_ssize_t i : a) if (i >= n_out) { PyErr_SetString(PyExc_ValueError, "bad output index"); return NULL; }
    Spec* s = reinterpret_cast<Spec*>(type->tp_alloc(type, 0));
    if (!s) return NULL;
    s->vectorcall = spec_call;
    Py_INCREF(fw_call);
    s->fw_call = fw_call;
    Py_INCREF(backward);
    s->backward = backward;
    s->n_in = n_in;
    s->n_out = n_out;
    s->n_saved = (Py_ssize_t)a.size();
    s->differentiable = new std::vector<bool>(n_out, false);
    for (Py_ssize_t i : d) if (i >= 0 && i < n_out) (*s->differentiable)[i] = true;
    s->checked = new std::vector<Py_ssize_t>(c);
    s->alias = new std::vector<Py_ssize_t>(a);
    s->single = single;
    s->materialize = materialize;
    return reinterpret_cast<PyObject*>(s);
}

bool read_dims(PyObject* seq, c10::SmallVector<int64_t, 8>& out) {
    PyObject* fast = PySequence_Fast(seq, "expected a tuple of ints");
    if (!fast) return false;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (v == -1 && PyErr_Occurred()) { Py_DECREF(fast); return false; }
        out.push_back(v);
    }
    Py_DECREF(fast);
    return true;
}

// empty_strided(size, stride, dtype=...): torch.empty_strided on the CPU without Python's
// argument parser and torch-function handling (~0.5 µs instead of ~1.2): the buffers of the
// generated C++ code, which are CPU buffers whatever the default device.
PyObject* empty_strided(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    HANDLE_TH_ERRORS
    if (nargs != 2 || !kwnames || PyTuple_GET_SIZE(kwnames) != 1 ||
        !PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0)) ||
        PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "dtype") != 0 ||
        !THPDtype_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "empty_strided(size, stride, dtype=dtype)");
        return NULL;
    }
    c10::SmallVector<int64_t, 8> sizes, strides;
    if (!read_dims(args[0], sizes) || !read_dims(args[1], strides)) return NULL;
    at::ScalarType dtype = reinterpret_cast<THPDtype*>(args[2])->scalar_type;
    return THPVariable_Wrap(at::empty_strided(sizes, strides, at::TensorOptions().dtype(dtype)));
    END_HANDLE_TH_ERRORS
}

PyMethodDef module_methods[] = {
    {"empty_strided", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(empty_strided)),
     METH_FASTCALL | METH_KEYWORDS, "empty_strided(size, stride, dtype=dtype): a CPU tensor"},
    {NULL, NULL, 0, NULL}};

PyMemberDef spec_members[] = {
    {"fw_call", T_OBJECT, offsetof(Spec, fw_call), READONLY, "the compiled forward"},
    {"backward", T_OBJECT, offsetof(Spec, backward), READONLY, "backward(held, grads)"},
    {NULL}};

PyTypeObject SpecType = {PyVarObject_HEAD_INIT(NULL, 0)};

using namespace torch::autograd;
// THP_FUNCTION_DEFAULT_METHODS less _set_sequence_nr (not exported by libtorch_python)
PyMethodDef node_methods[] = {
    {"_register_hook_dict", THPCppFunction_register_hook_dict, METH_O, nullptr},
    {"register_hook", THPCppFunction_register_hook, METH_O, nullptr},
    {"register_prehook", THPCppFunction_register_prehook, METH_O, nullptr},
    {"name", THPCppFunction_name, METH_NOARGS, nullptr},
    {"_sequence_nr", THPCppFunction_sequence_nr, METH_NOARGS, nullptr},
    {NULL}};
PyGetSetDef node_properties[] = {THP_FUNCTION_DEFAULT_PROPERTIES, {NULL}};
PyTypeObject NodeType;

PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_tempa_nativeautograd", NULL, -1, module_methods};

}  // namespace

PyMODINIT_FUNC PyInit__tempa_nativeautograd(void) {
    SpecType.tp_name = "_tempa_nativeautograd.Function";
    SpecType.tp_basicsize = sizeof(Spec);
    SpecType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC;
    SpecType.tp_vectorcall_offset = offsetof(Spec, vectorcall);
    SpecType.tp_call = PyVectorcall_Call;
    SpecType.tp_new = spec_new;
    SpecType.tp_dealloc = spec_dealloc;
    SpecType.tp_traverse = spec_traverse;
    SpecType.tp_clear = spec_clear;
    SpecType.tp_members = spec_members;
    if (PyType_Ready(&SpecType) < 0) return NULL;
    torch::autograd::_initFunctionPyTypeObject(NodeType, "TempaCompiledFunctionBackward",
                                               node_properties, node_methods);
    torch::autograd::registerCppFunction(typeid(TempaNode), &NodeType);
    PyObject* m = PyModule_Create(&moddef);
    if (!m) return NULL;
    Py_INCREF(&SpecType);
    if (PyModule_AddObject(m, "Function", reinterpret_cast<PyObject*>(&SpecType)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
"""


@functools.lru_cache(None)
def _key_parts() -> tuple:
    from .build import compiler_id
    include, _ = _torch_paths()
    return (sys.version, torch.__version__, torch.version.git_version, include,
            sysconfig.get_paths()["include"], compiler_id(config.cxx))


def _build():
    py_include = sysconfig.get_paths()["include"]
    include, lib = _torch_paths()
    for header in (os.path.join(py_include, "Python.h"),
                   os.path.join(include, "torch", "csrc", "autograd", "python_cpp_function.h")):
        if not os.path.exists(header):
            raise RuntimeError(f"no {header}")
    parts = _key_parts()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)

    def command(src, so):
        return [parts[-1].split("\n")[0], "-O2", "-shared", "-fPIC", "-w", "-std=c++17",
                f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{py_include}", f"-I{include}",
                f"-I{os.path.join(include, 'torch', 'csrc', 'api', 'include')}", "-o", so, src,
                f"-L{lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python",
                f"-Wl,-rpath,{lib}"]
    return extension.build_cached(_MODULE, "nativeautograd", SOURCE, "cpp", parts, command,
                                  timeout=600)


_extension = extension.BuiltOnce(
    _build, "native autograd node unavailable, using autograd.Function",
    "tempa-nativeautograd-build")


def module():
    """The loaded extension, building it first if need be (blocks); None where it cannot be
    built or loaded (said once, in the perf log)."""
    return _extension.get()


def module_if_ready(start_build: bool = True):
    """The extension when it is loaded or in the disk cache (then loaded now), else None;
    ``start_build``: then its build starts in the background, for the graphs compiled after
    it is done."""
    if not config.native_autograd:
        return None
    if _extension.settled():
        return _extension.get()
    try:
        cached = extension.is_cached("nativeautograd", SOURCE, _key_parts())
    except Exception:  # noqa: BLE001 - no compiler: get() says why, once
        cached = True
    if cached:
        return module()
    if start_build:
        _extension.prebuild()
    return None


def empty_strided():
    """The allocator for the generated code's buffers: the extension's ``empty_strided``
    where it is ready (it never starts the build: a training graph does), else
    ``torch.empty_strided``."""
    mod = module_if_ready(start_build=False)
    return torch.empty_strided if mod is None else mod.empty_strided


def function(fw_call, backward, n_in: int, n_out: int, differentiable, checked, alias,
             single: bool, materialize: bool = True):
    """The callable that runs ``fw_call`` under a native autograd node, or None (see the module
    docstring). ``fw_call(*inputs)``: the user outputs, then the saved values;
    ``backward(held, grads)``: the gradient of each input (or None) from ``held`` (the
    inputs, then the saved values) and one gradient per output (None: a non-differentiable
    output, or one the loss did not reach); ``differentiable``: the outputs that get history; ``checked``: the inputs the
    backward reads (version-checked); ``alias``: per saved value, the output it is, or -1;
    ``single``: return the one output itself; ``materialize``: a differentiable output
    without a gradient gets a zero tensor in ``grads`` (else None)."""
    mod = module_if_ready()
    if mod is None:
        return None
    return mod.Function(fw_call, backward, n_in, n_out, tuple(differentiable), tuple(checked),
                        tuple(alias), single, materialize)

"""Tensor metadata without tensors: the fast path of static capture.

Capture needs each operation's result shape, dtype, device and requires_grad, not its
values. PyTorch's fake and meta tensors answer that for every operator, but the first use
in a process imports PyTorch's compiler packages (about 2.5 s on this machine), which
would dwarf compiling a small model. So capture first asks the rules here, written for the
operations common models use; an operation without a rule switches that capture to fake
tensors (``graph.py``), so coverage never depends on this table. A differential test
(tests/capture/test_meta_rules.py) checks every rule against real execution on the zoo.

``MetaInfo`` answers the tensor metadata API the interpreter and user code read
(``shape``, ``size()``, ``dim()``, ``stride()``, ``is_contiguous()``, ...).
"""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

from .metainfo import MetaInfo, NoRule  # noqa: F401  (re-exported)
from .metainfo import _like
from .meta_math import (_unary_same, _unary_float, _inplace, _binary, _where, _masked_fill,
                        _clamp, _dropout, _softmax, _reduce, _minmax, _arg, _linear, _matmul,
                        _bmm, _mm, _addmm, _sdpa, _layer_norm, _embedding, _batch_norm,
                        _group_norm, _conv, _cross_entropy)
from .meta_shape import (_view, _view_method, _permute, _transpose, _t, _unsqueeze, _squeeze,
                         _flatten, _expand, _split, _chunk, _unbind, _cat, _stack, _getitem,
                         _to, _as, _type_as, _factory, _full, _arange, _like_factory,
                         _full_like, _new_factory, _new_full, _tri, _cumsum, _repeat)


def is_meta(v) -> bool:
    return isinstance(v, MetaInfo)


def infer(kind: str, target, args: tuple, kwargs: dict):
    """The result of ``target(*args, **kwargs)`` with MetaInfo in place of tensors."""
    method = kind == "call_method"
    rule = (METHOD_RULES if method else FUNCTION_RULES).get(target)
    if rule is None:
        raise NoRule()
    if torch._C._is_any_autocast_enabled() and \
            target not in (AUTOCAST_NEUTRAL_METHODS if method else AUTOCAST_NEUTRAL_FUNCTIONS):
        args, kwargs = _autocast_operands(target, args, kwargs)
    return rule(*args, **kwargs)


def _autocast_operands(target, args, kwargs):
    """The operands as autocast hands them to ``target``: its float tensors (not float64)
    cast to the autocast dtype or to float32, by the operation's policy on the device of its
    first tensor (AUTOCAST_POLICY). NoRule where the policy is not known here (fake
    tensors then answer, with PyTorch's own autocast)."""
    first = next((a for a in args if isinstance(a, (MetaInfo, torch.Tensor))), None)
    if first is None:
        raise NoRule()
    device = first.device.type
    if not torch.is_autocast_enabled(device):
        return args, kwargs                  # autocast is on for another device type
    policy = AUTOCAST_POLICY.get(device, {}).get(target)
    if policy is None or kwargs.get("dtype") is not None:
        raise NoRule()
    if policy == "same":
        return args, kwargs
    dtype = torch.float32 if policy == "float32" else torch.get_autocast_dtype(device)

    def cast(v):
        if isinstance(v, (MetaInfo, torch.Tensor)) and v.dtype.is_floating_point and v.dtype != torch.float64:
            return _like(v, dtype=dtype, stride=v.stride())
        return v
    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


# -- the tables ----------------------------------------------------------------------------

_UNARY_SAME_NAMES = ["relu", "neg", "abs", "clone", "square", "floor", "ceil",
                     "round", "sign", "trunc", "frac", "hardtanh", "relu6", "leaky_relu",
                     "elu", "selu", "celu", "hardswish", "hardsigmoid", "bitwise_not",
                     "nan_to_num", "positive"]
_UNARY_FLOAT_NAMES = ["sigmoid", "tanh", "exp", "exp2", "expm1", "log", "log2", "log10",
                      "log1p", "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos", "atan",
                      "sinh", "cosh", "erf", "erfc", "erfinv", "reciprocal", "gelu", "silu",
                      "mish", "softplus", "logsigmoid", "tanhshrink", "softsign", "lgamma",
                      "digamma"]
_BINARY = {"add": "arith", "sub": "arith", "mul": "arith", "div": "truediv",
           "true_divide": "truediv", "floor_divide": "arith", "remainder": "arith",
           "fmod": "arith", "pow": "arith", "maximum": "arith", "minimum": "arith",
           "atan2": "truediv", "bitwise_and": "arith", "bitwise_or": "arith",
           "bitwise_xor": "arith", "eq": "compare", "ne": "compare", "lt": "compare",
           "le": "compare", "gt": "compare", "ge": "compare", "logical_and": "compare",
           "logical_or": "compare", "logical_xor": "compare", "rsub": "arith"}
_OPERATORS = {operator.add: "arith", operator.sub: "arith", operator.mul: "arith",
              operator.truediv: "truediv", operator.floordiv: "arith", operator.mod: "arith",
              operator.pow: "arith", operator.and_: "arith", operator.or_: "arith",
              operator.xor: "arith", operator.lt: "compare", operator.le: "compare",
              operator.gt: "compare", operator.ge: "compare", operator.eq: "compare",
              operator.ne: "compare"}
_INPLACE_OPERATORS = [operator.iadd, operator.isub, operator.imul, operator.itruediv]

FUNCTION_RULES: dict = {}
METHOD_RULES: dict = {}


def _register():
    fr, mr = FUNCTION_RULES, METHOD_RULES
    for names, rule in ((_UNARY_SAME_NAMES, _unary_same), (_UNARY_FLOAT_NAMES, _unary_float)):
        for name in names:
            for ns in (torch, F, torch.special):
                fn = getattr(ns, name, None)
                if fn is not None:
                    fr[fn] = rule
            mr[name] = rule
            mr[name + "_"] = _inplace
    fr[F.relu] = fr[torch.relu] = _unary_same
    fr[F.dropout] = fr[torch.dropout] = _dropout
    mr["contiguous"] = lambda x, *a, **k: x if x.is_contiguous() else _like(x)
    mr["detach"] = lambda x: _like(x, grad=False, stride=x.stride())
    for name, kind in _BINARY.items():
        fn = getattr(torch, name, None)
        if fn is not None:
            fr[fn] = _binary(kind)
        mr[name] = _binary(kind)
        mr[name + "_"] = _inplace
    for op, kind in _OPERATORS.items():
        fr[op] = _binary(kind)
    for op in _INPLACE_OPERATORS:
        fr[op] = _inplace_operator
    fr[operator.neg] = _unary_same
    fr[operator.matmul] = fr[torch.matmul] = mr["matmul"] = _matmul
    fr[torch.mm] = mr["mm"] = _mm
    fr[torch.bmm] = mr["bmm"] = _bmm
    fr[torch.addmm] = mr["addmm"] = _addmm
    fr[F.linear] = _linear
    fr[F.conv1d] = fr[torch.conv1d] = _conv(1)
    fr[F.conv2d] = fr[torch.conv2d] = _conv(2)
    fr[F.cross_entropy] = _cross_entropy
    fr[F.scaled_dot_product_attention] = _sdpa
    fr[F.layer_norm] = _layer_norm
    fr[F.embedding] = _embedding
    fr[F.batch_norm] = _batch_norm
    fr[F.group_norm] = _group_norm
    for fn in (F.softmax, F.log_softmax, torch.softmax, torch.log_softmax):
        fr[fn] = _softmax
    mr["softmax"] = mr["log_softmax"] = _softmax
    fr[torch.where] = mr["where"] = _where
    mr["masked_fill"] = _masked_fill
    mr["masked_fill_"] = lambda x, mask, value: _inplace(x, mask)
    fr[torch.masked_fill] = _masked_fill
    fr[torch.clamp] = mr["clamp"] = mr["clip"] = fr[torch.clip] = _clamp
    mr["clamp_"] = mr["clamp_min_"] = mr["clamp_max_"] = lambda x, *a, **k: x
    mr["clamp_min"] = mr["clamp_max"] = lambda x, v: _like(x)
    for name, kind in (("sum", "sum"), ("mean", "mean"), ("amax", "same"), ("amin", "same"),
                       ("prod", "sum"), ("var", "mean"), ("std", "mean"), ("any", "bool"),
                       ("all", "bool"), ("logsumexp", "mean")):
        fr[getattr(torch, name)] = mr[name] = _reduce(kind)
    fr[torch.max] = mr["max"] = _minmax_dispatch(torch.return_types.max)
    fr[torch.min] = mr["min"] = _minmax_dispatch(torch.return_types.min)
    fr[torch.argmax] = mr["argmax"] = fr[torch.argmin] = mr["argmin"] = _arg
    mr["view"] = _view_method
    fr[torch.reshape] = mr["reshape"] = _view
    fr[torch.permute] = mr["permute"] = _permute
    fr[torch.transpose] = mr["transpose"] = _transpose
    fr[torch.t] = mr["t"] = _t
    fr[torch.unsqueeze] = mr["unsqueeze"] = _unsqueeze
    fr[torch.squeeze] = mr["squeeze"] = _squeeze
    fr[torch.flatten] = mr["flatten"] = _flatten
    mr["expand"] = _expand
    mr["expand_as"] = lambda x, other: _expand(x, *other.shape)
    mr["view_as"] = lambda x, other: _view_method(x, *other.shape)
    mr["reshape_as"] = lambda x, other: _view(x, *other.shape)
    fr[torch.split] = mr["split"] = _split
    fr[torch.chunk] = mr["chunk"] = _chunk
    fr[torch.unbind] = mr["unbind"] = _unbind
    fr[torch.cat] = fr[torch.concat] = _cat
    fr[torch.stack] = _stack
    fr[operator.getitem] = mr["__getitem__"] = _getitem
    mr["to"] = _to
    mr["type_as"] = _type_as
    for name, dtype in (("float", torch.float32), ("double", torch.float64),
                        ("half", torch.float16), ("bfloat16", torch.bfloat16),
                        ("long", torch.int64), ("int", torch.int32), ("bool", torch.bool)):
        mr[name] = _as(dtype)
    for name in ("zeros", "ones", "empty", "rand", "randn"):
        fr[getattr(torch, name)] = _factory
        fr[getattr(torch, name + "_like")] = mr.setdefault(name + "_like", _like_factory)
        mr["new_" + name] = _new_factory
    fr[torch.full] = _full
    fr[torch.full_like] = _full_like
    mr["new_full"] = _new_full
    fr[torch.arange] = _arange
    fr[torch.tril] = fr[torch.triu] = mr["tril"] = mr["triu"] = _tri
    mr["tril_"] = mr["triu_"] = lambda x, *a: x
    fr[torch.cumsum] = mr["cumsum"] = _cumsum
    mr["repeat"] = _repeat
    for name in ("copy_", "fill_", "zero_", "normal_", "uniform_", "add_", "mul_", "sub_",
                 "div_", "masked_fill_"):
        mr.setdefault(name, _inplace)


def _inplace_operator(a, b):
    if not isinstance(a, (MetaInfo, torch.Tensor)):
        raise NoRule()
    return _inplace(a, b)


def _minmax_dispatch(result_type):
    def rule(x, *args, **kwargs):
        if args and isinstance(args[0], (MetaInfo, torch.Tensor)):
            return _binary("arith")(x, args[0])
        out = _minmax(x, *args, **kwargs)
        return result_type(out) if isinstance(out, tuple) else out
    return rule


_register()

# Operations that no autocast policy lists (PyTorch's CUDA and CPU autocast tables:
# matmuls and convolutions run in the low precision; losses, norms, softmax, exp/log and
# sums in float32 on CUDA; some ops promote): they compute in their inputs' dtypes under
# autocast too, so their rules stay valid there. Why it matters: an operation without a
# rule switches the capture to fake tensors, whose first use in a process imports
# PyTorch's compiler packages (3.1-3.7 s of a GPT's first call on the H200, profiled).
_NEUTRAL_NAMES = ["reshape", "permute", "transpose", "t", "unsqueeze", "squeeze", "flatten",
                  "split", "chunk", "unbind", "where", "masked_fill", "relu", "dropout",
                  "zeros", "ones", "empty", "rand", "randn", "zeros_like", "ones_like",
                  "empty_like", "rand_like", "randn_like", "full", "full_like", "arange",
                  "tril", "triu", "add", "sub", "mul", "div", "true_divide", "rsub", "neg",
                  "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
                  "logical_not", "logical_xor"]
AUTOCAST_NEUTRAL_FUNCTIONS = {getattr(torch, n) for n in _NEUTRAL_NAMES if hasattr(torch, n)} | {
    F.dropout, F.relu, F.gelu, F.silu, F.embedding, operator.getitem, operator.add, operator.sub,
    operator.mul, operator.truediv, operator.neg, operator.lt, operator.le, operator.gt, operator.ge,
    operator.eq, operator.ne, operator.iadd, operator.isub, operator.imul, operator.itruediv}

# How autocast treats the other operations that have rules, per device type (from
# PyTorch's autocast tables, aten/src/ATen/autocast_mode.cpp; checked against real
# execution by tests/capture/test_meta_rules.py on the CPU and, on a GPU machine, CUDA):
# "lower" runs in the autocast dtype, "float32" in float32, "same" as without autocast.
# An operation not named has no rule under autocast.
_LOWER = [F.linear, torch.matmul, operator.matmul, "matmul", torch.mm, "mm", torch.bmm, "bmm",
          torch.addmm, "addmm", F.scaled_dot_product_attention, F.conv1d, torch.conv1d,
          F.conv2d, torch.conv2d]
_SOFTMAX = [F.softmax, torch.softmax, "softmax", F.log_softmax, torch.log_softmax, "log_softmax"]
AUTOCAST_POLICY = {
    "cuda": {**dict.fromkeys(_LOWER, "lower"),
             **dict.fromkeys(_SOFTMAX + [F.layer_norm, F.group_norm, F.cross_entropy], "float32")},
    "cpu": {**dict.fromkeys(_LOWER, "lower"), F.cross_entropy: "float32",
            **dict.fromkeys(_SOFTMAX + [F.layer_norm, F.group_norm], "same")},
}
AUTOCAST_NEUTRAL_METHODS = set(_NEUTRAL_NAMES) | {
    "view", "expand", "expand_as", "view_as", "reshape_as", "__getitem__", "contiguous",
    "detach", "to", "type_as", "float", "double", "half", "bfloat16", "long", "int", "bool",
    "new_zeros", "new_ones", "new_empty", "new_full", "masked_fill_", "copy_", "fill_",
    "zero_", "add_", "sub_", "mul_", "div_", "tril_", "triu_"}

"""The graph being captured: an FX graph, its inputs, fake tensors and guards.

Every torch operation the interpreter meets is run on fake tensors (to learn the result's
shape, dtype and device without computing anything) and recorded as an FX node.
"""
from __future__ import annotations

import contextlib
import contextvars
import keyword
import logging
import operator
import re

import torch
import torch.fx as fx
from torch.fx.passes.shape_prop import TensorMetadata
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode, DataDependentOutputException, \
    DynamicOutputShapeException, UnsupportedOperatorException

from .breaks import Unsupported, UserError
from .guards import GuardSet, is_numpy_scalar
from .values import ScalarVar, TensorVar
from .meta import MetaInfo, infer

# Calls kept in the graph even though nothing reads their result (they change state).
_SIDE_EFFECT_TARGETS = {torch._C._set_grad_enabled, torch.amp.autocast_mode._enter_autocast,
                        torch.amp.autocast_mode._exit_autocast, operator.setitem,
                        torch._check}


# Operations that symbolic captures shape with tempa's own rules (meta.py) instead of fake
# tensors. Their fake kernels run ATen's composite matmul in C++, which on torch 2.11 reads
# the plain (non-symbolic) sizes of a batched operand: with an input that requires grad the
# read goes through the fake tensor's size handler, which calls int() on every SymInt and so
# guards each symbol to its example value (the graph silently becomes static again, and the
# next size recompiles); without one it raises "Cannot call numel() on tensor with symbolic
# sizes". That covers every matmul that is not 2-d @ 2-d (a @ b, torch.matmul, Tensor.matmul)
# and F.linear / nn.Linear when ATen routes it to matmul: no bias (a GPT's tied lm_head), or
# a bias with a non-contiguous 3-d input. torch 2.13's fake kernels keep the symbols; the
# rules give the same shapes on every version.
_RULE_SHAPED = {operator.matmul, torch.matmul, "matmul", F.linear}


class CapturedGraph(fx.Graph):
    """The FX graph of a capture: each operation is stamped with the user's stack where
    capture recorded it (``node.stack_trace``, as in torch.compile's graphs, so the printed
    code names the user's file and line). ``where`` makes that text; the tracer sets it and
    ``GraphBuilder.finish`` clears it (a finished graph keeps no capture state alive)."""

    def __init__(self):
        super().__init__()
        self.where = None

    def create_node(self, op, *args, **kwargs):
        node = super().create_node(op, *args, **kwargs)
        if self.where is not None and op.startswith("call"):
            node.stack_trace = self.where()
        return node


class GraphBuilder:
    def __init__(self, *, symbolic: bool = False):
        self.graph = CapturedGraph()
        self.sizes = None
        # Static captures start on metadata rules (meta.py) and create fake tensors only
        # when an operation has no rule; symbolic sizes need fake tensors from the start.
        self.fake_mode = None
        if symbolic:
            # imported here: shapes.py pulls in sympy (~1-2 s), which static captures never use
            from .shapes import SymbolicSizes, make_shape_env
            env = make_shape_env()
            self.fake_mode = FakeTensorMode(allow_non_fake_inputs=False, shape_env=env)
            self.sizes = SymbolicSizes(self.graph, env)
        # the FX nodes of sizes the graph computes (symbolic and unbacked ones); in a static
        # capture made with its ShapeEnv on first need (unbacked_env)
        self.size_nodes = self.sizes
        # captured number -> its unbacked symbol; at finish, each node's meta["unbacked_symbol"]
        # (the backend reads which sizes a number is: backend/split_at_values.py)
        self.scalar_symbols: dict[fx.Node, object] = {}
        self._asserts_seen = 0   # deferred runtime asserts of the ShapeEnv at the last op
        self.guards = GuardSet()
        self.user_inputs: list[tuple[fx.Node, str, torch.Tensor]] = []  # (placeholder, expr, tensor)
        self.attr_inputs: list[tuple[fx.Node, torch.Tensor]] = []  # parameters, buffers, ...
        # Python ints taken as symbols (automatic dynamic):
        # expr -> (placeholder, local, SymInt, the int of this call)
        self.int_inputs: dict[str, tuple[fx.Node, str, object, int]] = {}
        self._input_by_id: dict[int, TensorVar] = {}
        self._expr_by_id: dict[int, str] = {}            # id(user input tensor) -> its expression
        self._names: set[str] = set()
        self.modules: dict[int, torch.nn.Module] = {}   # modules this graph depends on
        self.keepalive: list = []                       # objects whose id() we rely on

    # -- inputs ------------------------------------------------------------------------
    def _placeholder(self, hint: str, name: str | None = None) -> fx.Node:
        if name is None:
            name = re.sub(r"\W+", "_", hint).strip("_") or "input"
            if name[0].isdigit():
                name = "t_" + name
            if name == "self" or keyword.iskeyword(name):
                # The GraphModule's forward has its own `self`: an input named so (a function
                # whose first parameter is `self`, Tensor.backward reached after a break) would
                # be dropped from the signature and the graph called with one argument too many.
                name += "_arg"
        base, i = name, 1
        while name in self._names:
            name, i = f"{base}_{i}", i + 1
        self._names.add(name)
        return self.graph.placeholder(name)

    def user_input(self, tensor: torch.Tensor, expr: str, dynamic_dims=()) -> TensorVar:
        """A tensor passed by the caller (argument or item of one): guarded on every call.
        ``dynamic_dims`` become symbolic sizes (contiguous inputs only: their strides follow
        from their sizes, so the guard can check ``is_contiguous()`` instead)."""
        hit = self._input_by_id.get(id(tensor))
        if hit is not None:
            # the same tensor passed twice (f(z, z)), or a parameter passed as an argument:
            # the graph has one input for both, so later calls must pass one object too
            first = self._expr_by_id.get(id(tensor)) or self.guards.const(tensor, "P")
            if first != expr:
                self.guards.add("identity", f"{expr} is {first}", f"{expr} is {first}")
            return hit
        self._expr_by_id[id(tensor)] = expr
        node = self._placeholder(expr, name=source_input_name(expr))
        dims = set(dynamic_dims) if self.sizes is not None and tensor.is_contiguous() else set()
        if dims:
            fake = self.fake_mode.from_tensor(tensor, symbolic_context=self.sizes.context_for(tensor, dims))
            self.sizes.register(fake, expr, node)
            # a size of 0 or 1 stays a constant (shapes.make_shape_env): the graph is then
            # specialised to it, so the guard must check it like any static dimension
            dims = {d for d in dims if isinstance(fake.shape[d], torch.SymInt)}
        else:
            fake = self._example_of(tensor)
        var = TensorVar(node, fake)
        node.meta["example_value"] = fake
        self.user_inputs.append((node, expr, tensor))
        self._input_by_id[id(tensor)] = var
        self.keepalive.append(tensor)
        self.guards.tensor(expr, tensor, dynamic_dims=tuple(sorted(dims)))
        return var

    def int_input(self, value: int, expr: str):
        """A Python int read at ``expr`` whose value changed between calls (an argument, a
        counter on the caller's object): a graph input and a symbol (``shapes.int_input``),
        so the next values reuse this graph; guarded by type only, and by whatever the
        capture decided on its value. Its value reaches the graph through a local of the
        entry bound before the graph runs."""
        hit = self.int_inputs.get(expr)
        if hit is not None:
            return hit[2]
        node = self._placeholder(expr, name=source_input_name(expr))
        local = f"___int{len(self.int_inputs)}"
        symbol = self.sizes.int_input(value, expr, node, local)
        node.meta["example_value"] = symbol
        self.int_inputs[expr] = (node, local, symbol, value)
        # (before the guards on the symbol, which compare it with numbers)
        self.guards.add("identity", f"({expr}).__class__ is {self.guards.const(int, 'T')}",
                        f"{expr} is an int")
        return symbol

    def argument_tensor(self, var: TensorVar):
        """The caller's tensor behind ``var`` when ``var`` is a tensor argument, else None."""
        for node, _, tensor in self.user_inputs:
            if node is var.node:
                return tensor
        return None

    def argument_expr(self, var: TensorVar):
        """The guard expression of the tensor argument behind ``var`` (else None)."""
        return next((expr for node, expr, _ in self.user_inputs if node is var.node), None)

    def attr_input(self, tensor: torch.Tensor, hint: str) -> TensorVar:
        """A tensor reached through a module or object (parameter, buffer, global): read live
        on every call, so optimizer updates are seen; its identity is guarded elsewhere."""
        hit = self._input_by_id.get(id(tensor))
        if hit is not None:
            return hit
        node = self._placeholder(hint)
        fake = self._example_of(tensor)
        var = TensorVar(node, fake)
        node.meta["example_value"] = fake
        self.attr_inputs.append((node, tensor))
        # read live on every call: `.data = ...`, `.half()`, `requires_grad_()` change the
        # same object, so its metadata is guarded like an argument's
        self.guards.tensor(self.guards.const(tensor, "P"), tensor, what=hint, attribute=True)
        self._input_by_id[id(tensor)] = var
        return var

    def input_source(self, var: TensorVar):
        """(tensor, expression in the entry) of the input ``var`` stands for (also after an
        in-place operation renamed its node), or None for a tensor computed in the graph."""
        for _, expr, tensor in self.user_inputs:
            if self._input_by_id.get(id(tensor)) is var:
                return tensor, expr
        for _, tensor in self.attr_inputs:
            if self._input_by_id.get(id(tensor)) is var:
                return tensor, self.guards.const(tensor, "P")
        return None

    def input_var(self, tensor: torch.Tensor) -> TensorVar:
        """The TensorVar that stands for this input tensor (argument or attribute)."""
        return self._input_by_id[id(tensor)]

    def _example_of(self, tensor: torch.Tensor):
        if self.fake_mode is None:
            return MetaInfo.of(tensor)
        return self.fake_mode.from_tensor(tensor, static_shapes=True)

    def unbacked_env(self):
        """The ShapeEnv that gives numbers computed from tensor values (a captured ``.item()``,
        the length of ``unique_consecutive``'s result) unbacked symbols, as torch.compile's
        ``capture_scalar_outputs`` and ``capture_dynamic_output_shape_ops`` do. A static
        capture starts without one (it imports sympy) and switches its fake tensors to a
        mode with one on first need; their metadata carries over (``_use_fake_tensors``)."""
        if self.fake_mode is None or self.fake_mode.shape_env is None:
            from .shapes import SymbolicSizes, make_shape_env
            env = make_shape_env()
            self.fake_mode = FakeTensorMode(allow_non_fake_inputs=False, shape_env=env)
            self.size_nodes = SymbolicSizes(self.graph, env)
        return self.fake_mode.shape_env

    def _use_fake_tensors(self, values) -> None:
        """Switch this capture to fake tensors: every TensorVar in ``values`` gets one (of
        the current fake mode: one made before a switch to a ShapeEnv is made again)."""
        if self.fake_mode is None:
            self.fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
        for var in _vars_in(values):
            m = var.fake
            if isinstance(m, MetaInfo) or \
                    getattr(m, "fake_mode", self.fake_mode) is not self.fake_mode:
                with self.fake_mode:
                    var.fake = torch.empty_strided(m.shape, m.stride(), dtype=m.dtype,
                                                   device=m.device, requires_grad=m.requires_grad)
                var.node.meta["example_value"] = var.fake

    # -- operations --------------------------------------------------------------------
    def call(self, kind: str, target, args: tuple, kwargs: dict):
        """Record ``target(*args, **kwargs)`` (kind: call_function|call_method), work out its
        result's metadata (rules, else fake tensors) and return the result with TensorVars
        in place of tensors."""
        args, kwargs = self._lift_constants(args), self._lift_constants(kwargs)
        if target not in _SCALAR_CONSUMERS and _has_scalar((args, kwargs)):
            # its metadata can depend on the value (torch.arange(v), x[:v]): worked out by
            # fake tensors with the value as an unbacked symbol
            return self._call_with_unbacked(kind, target, args, kwargs)
        node_args = _map(args, self._to_node)
        node_kwargs = _map(kwargs, self._to_node)
        if self.sizes is None:
            try:
                result = infer(kind, target, _map(args, _to_fake), _map(kwargs, _to_fake))
            except Exception:  # NoRule, or a rule's error: fake tensors give the exact answer
                pass
            else:
                node = self.graph.create_node(kind, target, node_args, node_kwargs)
                return self._result(node, result, target, (args, kwargs))
            self._use_fake_tensors((args, kwargs))
        fake_args = _map(args, _to_fake)
        fake_kwargs = _map(kwargs, _to_fake)
        if self.sizes is not None and target in _RULE_SHAPED:
            result = self._shape_by_rule(kind, target, fake_args, fake_kwargs)
            if result is not None:
                node = self.graph.create_node(kind, target, node_args, node_kwargs)
                return self._result(node, result, target, (args, kwargs))
        try:
            result = self._run_fake(kind, target, fake_args, fake_kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException) as e:
            if self.fake_mode.shape_env is not None:
                raise Unsupported("data-dependent value", f"{_name(target)} needs tensor values "
                                  f"({type(e).__name__})") from None
            # an op that reads a tensor's value (a 0-d tensor as a Scalar argument) or whose
            # result's size does (unique_consecutive, nonzero, x[mask]): again, with unbacked
            # symbols for those. It stays in the graph (torch.compile's
            # capture_dynamic_output_shape_ops); the backend runs it as its ATen call between
            # compiled pieces (backend/split_at_values.py)
            self.unbacked_env()
            return self.call(kind, target, args, kwargs)
        return self._recorded(kind, target, (args, kwargs), result)

    def _run_fake(self, kind, target, fake_args, fake_kwargs):
        """The operation on fake tensors; Unsupported for a decision on an unbacked value,
        UserError for the user's own error (bad shapes...), which eager raises too."""
        try:
            with self.fake_mode, _quiet_fake_kernel_errors():
                if kind == "call_method":
                    return getattr(fake_args[0], target)(*fake_args[1:], **fake_kwargs)
                return target(*fake_args, **fake_kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException):
            raise
        except UnsupportedOperatorException as e:
            raise Unsupported("unsupported call", f"{_name(target)}: no fake-tensor rule ({e})") from None
        except Unsupported:
            raise
        except Exception as e:
            if is_data_dependent_guard(e):
                raise Unsupported("data-dependent branch", f"{_name(target)} decides on a value "
                                  "computed from a tensor") from None
            raise UserError(e) from None

    def _recorded(self, kind, target, arguments, result):
        """The node of an operation whose fake result is ``result``. Where the capture has
        unbacked symbols, a number of the result must not be one (Python would need its
        value), and sizes of its tensors that are new ones get ``size`` nodes of those.
        The checks its fake kernel made on unbacked symbols (``0 <= v`` for arange(v)) are
        eager's own, made again when the graph runs; later decisions may rely on them
        (``v >= 0`` is then True), so the node is never dead code."""
        args, kwargs = arguments
        node = self.graph.create_node(kind, target, _map(args, self._to_node),
                                      _map(kwargs, self._to_node))
        env = self.fake_mode.shape_env if self.fake_mode is not None else None
        if env is not None and _has_unbacked_number(result):
            self.graph.erase_node(node)
            raise Unsupported("data-dependent value", f"{_name(target)} returns a number "
                              "computed from tensor values")
        wrapped = self._result(node, result, target, arguments)
        if env is not None:
            for var in _vars_in(wrapped):
                self.size_nodes.bind_unbacked_sizes(var.fake, var.node)
            asserts = _count_asserts(env)
            if asserts != self._asserts_seen:
                self._asserts_seen = asserts
                node.meta["runtime_asserts"] = True
        return wrapped

    def _call_with_unbacked(self, kind, target, args, kwargs):
        """``target`` given a captured number where it needs a Python one (``torch.arange(v)``,
        ``x[:v]``): its metadata from fake tensors, the number as an unbacked symbol. A fake
        kernel that cannot work symbolically is a graph break: Python then sees the value."""
        from . import scalars
        self.unbacked_env()
        self._use_fake_tensors((args, kwargs))

        def fake(v):
            return scalars.symbol_of(self, v) if isinstance(v, ScalarVar) else _to_fake(v)
        fake_args, fake_kwargs = _map(args, fake), _map(kwargs, fake)
        try:
            if target is operator.getitem and isinstance(args[1], ScalarVar):
                # x[v]: Python's indexing wants an int; an int index is select(0, v)
                result = self._run_fake("call_method", "select",
                                        (fake_args[0], 0, fake_args[1]), {})
            else:
                result = self._run_fake(kind, target, fake_args, fake_kwargs)
        except (UserError, DataDependentOutputException, DynamicOutputShapeException):
            raise Unsupported("data-dependent value", f"{_name(target)} of a value computed "
                              "from a tensor needs that value in Python") from None
        return self._recorded(kind, target, (args, kwargs), result)

    def _result(self, node: fx.Node, result, target, arguments):
        """``wrap``, except that an operation returning one of its own arguments (in-place
        methods, ``x += 1``, ``out=``, ``x.float()`` of a float tensor: the rule or fake
        kernel hands back that argument's metadata object) returns that argument's
        TensorVar, now naming this node: ``y = x.add_(1); x is y`` holds as in eager."""
        if isinstance(result, (torch.Tensor, MetaInfo)):
            for var in _vars_in(arguments):
                if var.fake is result:
                    node.meta["example_value"] = result
                    node.meta["returns_argument"] = True   # in place: never dead code
                    var.node = node
                    return var
        return self.wrap(node, result, target)

    def _shape_by_rule(self, kind, target, fake_args, fake_kwargs):
        """The result of a ``_RULE_SHAPED`` call as a fake tensor, its shape worked out by
        tempa's metadata rule on the symbolic sizes; None where the rule does not apply
        (the fake kernel then decides, and raises eager's error for bad arguments)."""
        try:
            meta = infer(kind, target, fake_args, fake_kwargs)
        except Exception:  # NoRule (autocast too), or a rule's error: the fake kernel
            return None     # then decides, exactly as eager would
        if not isinstance(meta, MetaInfo):
            return None
        # Matmul and linear results are contiguous in eager for every input layout (the
        # static path's rules and their differential test assume the same).
        with self.fake_mode:
            return torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype,
                                       device=meta.device, requires_grad=meta.requires_grad)

    def _lift_constants(self, value):
        """The arguments of a node as FX can write them into its generated code: a real
        tensor reached without a source (a partial's keyword, a closure) becomes an input
        read live like a buffer; an object whose repr is not Python source (a numpy array,
        a torch.Generator, a user object) cannot be a graph argument at all."""
        t = type(value)
        if t is tuple or t is list:
            return t(self._lift_constants(v) for v in value)
        if t is dict:
            return {k: self._lift_constants(v) for k, v in value.items()}
        if isinstance(value, torch.Tensor):
            return self.attr_input(value, "constant")
        if t is type and value in _PYTHON_SCALAR_DTYPES:
            # x.to(float): torch reads a Python scalar type as this dtype, and FX cannot
            # write the class into the graph's code
            return _PYTHON_SCALAR_DTYPES[value]
        if t is slice or isinstance(value, _FX_LITERALS) or is_numpy_scalar(value) or \
                isinstance(value, tuple) or callable(value):
            return value
        kind = "non-torch library call" if t.__module__.split(".")[0] == "numpy" \
            else "unsupported call"
        raise Unsupported(kind, f"a {t.__module__}.{t.__qualname__} argument of a torch "
                          "operation runs in Python")

    def _to_node(self, v):
        if isinstance(v, (TensorVar, ScalarVar)):
            return v.node
        if isinstance(v, torch.SymInt):
            return self.size_nodes.node_for(v) if self.size_nodes is not None else int(v)
        if isinstance(v, torch.SymFloat):
            return self.size_nodes.float_node_for(v)
        if isinstance(v, torch.SymBool):   # (x.shape[0] == 2) or (n == 2) as an operand
            return self.size_nodes.expr_node(v.node.expr)
        if is_numpy_scalar(v):
            return v.item()   # FX prints constants as source; numpy's repr is not valid there
        return v

    def wrap(self, node: fx.Node, result, target=None):
        if isinstance(result, (torch.Tensor, MetaInfo)):
            node.meta["example_value"] = result
            return TensorVar(node, result)
        if isinstance(result, (tuple, list)) and any(isinstance(r, (torch.Tensor, MetaInfo)) for r in result):
            node.meta["example_value"] = result
            items = []
            for i, r in enumerate(result):
                if isinstance(r, (torch.Tensor, MetaInfo)):
                    item = self.graph.call_function(operator.getitem, (node, i))
                    item.meta["example_value"] = r
                    items.append(TensorVar(item, r))
                else:
                    items.append(r)
            if type(result) is tuple or type(result) is list:
                return type(result)(items)
            return type(result)(items)  # torch.return_types structseq
        if result is None and target in _SIDE_EFFECT_TARGETS:
            return None
        if result is None and _mutates_arguments(target):
            return None  # an in-place method returning None: keep the node
        if not node.users:
            self.graph.erase_node(node)
        if isinstance(result, torch.Tensor) or _has_tensor(result):
            raise Unsupported("unsupported call", f"{_name(target)} returned tensors in a "
                              f"{type(result).__name__}")
        if not _is_plain_result(result):
            # an object of the fake tensor's (its storage, ...), not the caller's tensor's
            raise Unsupported("data-dependent value", f"{_name(target)} returned a "
                              f"{type(result).__name__}, which needs the real tensor")
        return result

    # -- finishing -----------------------------------------------------------------------
    def finish(self, outputs: list[TensorVar]) -> fx.GraphModule:
        # Placeholders: the caller's tensors first, then its ints, then parameters/buffers (the backend
        # contract). Attribute inputs are discovered mid-capture, so move them all up front.
        order = [n for n, _, _ in self.user_inputs] + [n for n, *_ in self.int_inputs.values()] + \
            [n for n, _ in self.attr_inputs]
        for node in reversed(order):
            first = next(iter(self.graph.nodes))
            if first is not node:
                first.prepend(node)
        self.graph.output(tuple(v.node for v in outputs))
        self.graph.where = None
        for node, symbol in self.scalar_symbols.items():
            node.meta["unbacked_symbol"] = symbol
        _unbind_rows_written_with_grad(self.graph)
        self.graph.eliminate_dead_code(is_impure_node=_is_impure)
        if self.sizes is None:
            self._drop_unread_inputs()
        _annotate_metadata(self.graph)
        gm = fx.GraphModule(torch.nn.Module(), self.graph)
        return gm

    def _drop_unread_inputs(self) -> None:
        """A tensor argument no operation reads is no input of the graph (torch.compile
        makes an input where a tensor is first used); its guards stay. (Symbolic captures
        keep every input: a size symbol is bound from the input it came from.)"""
        unread = {node for node, *_ in self.user_inputs + self.attr_inputs if not node.users}
        for node in unread:
            self.graph.erase_node(node)
        self.user_inputs = [i for i in self.user_inputs if i[0] not in unread]
        self.attr_inputs = [i for i in self.attr_inputs if i[0] not in unread]


def source_input_name(expr: str) -> str | None:
    """The name torch.compile gives the graph input read at ``expr``: that source as it
    spells it (``L['x']``, ``L['fn'].keywords['y']``, a resume function's ``L['___stack0']``)
    with each run of other characters made one ``_``: ``L_x_``, ``L_fn_keywords_y_``,
    ``L_stack0_``. None for an input read through an object bound as a constant."""
    root = re.match(r"[A-Za-z_]\w*", expr)
    if root is None or root.group().startswith("___") and not root.group().startswith("___stack"):
        return None
    return re.sub(r"[^a-zA-Z0-9]+", "_", f"L[{root.group()!r}]{expr[root.end():]}")


def _annotate_metadata(graph: fx.Graph) -> None:
    """Metadata-only example values (MetaInfo) as the ``tensor_meta`` FX prints in a
    graph's readable code (``"f32[2, 3]"``) and shape propagation would have recorded."""
    for node in graph.nodes:
        m = node.meta.get("example_value")
        if isinstance(m, MetaInfo):
            node.meta["tensor_meta"] = TensorMetadata(m.shape, m.dtype, m.requires_grad,
                                                      m.stride(), None, False, {})


_PLAIN_RESULT_TYPES = (type(None), bool, int, float, complex, str, torch.SymInt, torch.SymFloat,
                       torch.SymBool, torch.dtype, torch.device, torch.layout, torch.memory_format,
                       torch.Size)


def _is_plain_result(value, depth=0) -> bool:
    """A non-tensor result of an operation on fake tensors that is the same for the real
    ones: a number, a flag, a size, a dtype, a device, a string, or a tuple or list of those."""
    if isinstance(value, _PLAIN_RESULT_TYPES) or is_numpy_scalar(value):
        return True
    return isinstance(value, (tuple, list)) and depth < 4 and \
        all(_is_plain_result(v, depth + 1) for v in value)


# The dtype torch's argument parser reads a Python scalar type as (x.to(float) is float64).
_PYTHON_SCALAR_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64,
                         complex: torch.complex128}


def _unbind_rows_written_with_grad(graph: fx.Graph) -> None:
    """Rows of a tensor iteration are recorded as ``x[i]`` (interpreter ``_tensor_rows``);
    eager's are ``x.unbind(0)``'s multi-output views, and an in-place op that makes one
    require grad raises there ("... is a view and is being modified inplace"). Such a
    row's iteration goes back to unbind, so the graph raises eager's error."""
    groups: dict = {}
    for node in graph.nodes:
        group = node.meta.get("unbind_rows")
        if group is not None:
            groups.setdefault(group, []).append(node)
    for rows in groups.values():
        if any(_written_with_grad(row) for row in rows):
            source = rows[0].args[0]
            with graph.inserting_before(rows[0]):
                parts = graph.call_method("unbind", (source, 0))
                parts.meta["example_value"] = tuple(r.meta.get("example_value") for r in rows)
                new_rows = [graph.call_function(operator.getitem, (parts, i))
                            for i in range(len(rows))]
            for row, new in zip(rows, new_rows):
                new.meta.update(row.meta)
                del new.meta["unbind_rows"]
                row.replace_all_uses_with(new)
                graph.erase_node(row)


def _written_with_grad(row: fx.Node) -> bool:
    """An in-place op writes into ``row`` with an operand that requires grad (unbind is
    eager's exact behaviour, so a false positive only costs the op count)."""
    for user in row.users:
        if user.args and user.args[0] is row and _mutates_arguments(user.target):
            operands = [a for a in (*user.args[1:], *user.kwargs.values()) if isinstance(a, fx.Node)]
            if any(getattr(a.meta.get("example_value"), "requires_grad", False) for a in operands):
                return True
    return False


def _is_impure(node: fx.Node) -> bool:
    if node.op in ("placeholder", "output"):
        return True
    if node.target in _SIDE_EFFECT_TARGETS or node.meta.get("returns_argument") or \
            node.meta.get("runtime_asserts"):
        return True
    return _mutates_arguments(node.target) or _draws_random_numbers(node)


# Operations that draw from a random generator. Unused or not, each advances the generator
# as in eager, so that the draws after it (in the graph or after it) get eager's numbers.
_RANDOM_FUNCTIONS = {torch.rand, torch.randn, torch.randint, torch.randperm, torch.rand_like,
                     torch.randn_like, torch.randint_like, torch.normal, torch.poisson,
                     torch.bernoulli, torch.multinomial, torch.dropout, torch.alpha_dropout,
                     torch.feature_alpha_dropout, torch.rrelu, F.dropout, F.dropout1d,
                     F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
                     F.rrelu, F.gumbel_softmax}
_RANDOM_METHODS = {"bernoulli", "multinomial"}   # (in-place ones end in _: kept as mutations)


def _draws_random_numbers(node: fx.Node) -> bool:
    if "generator" in node.kwargs:
        return True
    if node.op == "call_method":
        return node.target in _RANDOM_METHODS
    return node.op == "call_function" and _key_in(node.target, _RANDOM_FUNCTIONS)


def _key_in(target, table) -> bool:
    try:
        return target in table
    except TypeError:   # an unhashable callable
        return False


def _mutates_arguments(target) -> bool:
    """An operation that writes into its arguments: x.add_(1), F.relu_, torch._foreach_mul_,
    aten.add_.Tensor or aten.add.out (an op overload says so in its schema)."""
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    return (name.endswith("_") and not name.endswith("__")) or name in _MUTATING_DUNDERS


# Tensor methods spelled as dunders that write into the tensor: ``x.__setitem__(0, v)`` or
# ``torch.Tensor.__iadd__(x, 1)`` called explicitly (their result unused, they were dropped).
_MUTATING_DUNDERS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__",
                     "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__",
                     "__ilshift__", "__irshift__", "__imatmul__"}




def is_data_dependent_guard(e: BaseException) -> bool:
    """``e`` is the ShapeEnv refusing to decide on an unbacked symbol (a value only the run
    knows). Its module is loaded only once a ShapeEnv exists, and so is the error."""
    import sys
    shapes = sys.modules.get("torch.fx.experimental.symbolic_shapes")
    return shapes is not None and isinstance(e, shapes.GuardOnDataDependentSymNode)


def _has_unbacked_number(value, depth=0) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
        return bool(free_unbacked_symbols(value))
    if depth < 6 and isinstance(value, (list, tuple)):
        return any(_has_unbacked_number(v, depth + 1) for v in value)
    return False


def _count_asserts(env) -> int:
    return sum(len(v) for v in env.deferred_runtime_asserts.values())


def _to_fake(v):
    if isinstance(v, ScalarVar):
        return v.example
    return v.fake if isinstance(v, TensorVar) else v


# Operations a ScalarVar may feed: Python's operators (shape-free for a scalar operand) and
# the 0-d tensor a scalar leaves the graph as.
_SCALAR_CONSUMERS = {operator.add, operator.sub, operator.mul, operator.truediv,
                     operator.floordiv, operator.mod, operator.lt, operator.le, operator.gt,
                     operator.ge, operator.eq, operator.ne, operator.iadd, operator.isub,
                     operator.imul, operator.itruediv, torch.scalar_tensor}


def _has_scalar(value, depth=0) -> bool:
    if isinstance(value, ScalarVar):
        return True
    if depth < 6 and isinstance(value, (list, tuple)):
        return any(_has_scalar(v, depth + 1) for v in value)
    if depth < 6 and isinstance(value, dict):
        return any(_has_scalar(v, depth + 1) for v in value.values())
    if isinstance(value, slice):
        return any(_has_scalar(v, depth + 1) for v in (value.start, value.stop, value.step))
    return False


# Argument values FX writes into generated code as valid Python (besides containers).
_FX_LITERALS = (TensorVar, ScalarVar, type(None), bool, int, float, complex, str, range, torch.dtype,
                torch.device, torch.layout, torch.memory_format, type(Ellipsis), torch.SymInt,
                torch.SymFloat, torch.SymBool, fx.Node)


def _map(value, fn):
    if isinstance(value, (TensorVar, ScalarVar)):
        return fn(value)
    t = type(value)
    if t is tuple or t is list:
        return t(_map(v, fn) for v in value)
    if t is dict:
        return {k: _map(v, fn) for k, v in value.items()}
    if t is slice:
        return slice(_map(value.start, fn), _map(value.stop, fn), _map(value.step, fn))
    if t is torch.Size:
        return tuple(_map(v, fn) for v in value) if any(
            isinstance(v, torch.SymInt) for v in value) else value
    if t is torch.SymInt or t is torch.SymFloat or t is torch.SymBool or is_numpy_scalar(value):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return t(*(_map(v, fn) for v in value))
    return value


def _vars_in(value, depth=0):
    if isinstance(value, TensorVar):
        yield value
    elif depth < 6 and isinstance(value, (list, tuple)):
        for v in value:
            yield from _vars_in(v, depth + 1)
    elif depth < 6 and isinstance(value, dict):
        for v in value.values():
            yield from _vars_in(v, depth + 1)
    elif isinstance(value, slice):
        for v in (value.start, value.stop, value.step):
            yield from _vars_in(v, depth + 1)


def _has_tensor(value) -> bool:
    if isinstance(value, (torch.Tensor, MetaInfo)):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_tensor(v) for v in value)
    if isinstance(value, dict):
        return any(_has_tensor(v) for v in value.values())
    return False


def _name(target) -> str:
    if isinstance(target, str):
        return "Tensor." + target
    mod = getattr(target, "__module__", None) or ""
    return f"{mod}.{getattr(target, '__name__', repr(target))}".lstrip(".")


_CAPTURING = contextvars.ContextVar("tempa_capturing_fake_call", default=False)


class _DuringCapture(logging.Filter):
    def filter(self, record):
        return not _CAPTURING.get()


# PyTorch logs a failed fake kernel at error level (with its traceback) before raising.
# Capture handles that exception (the user's error, which eager then raises; or a retry with
# real sizes, context.py): the log record would only be noise on the user's terminal.
logging.getLogger("torch._subclasses.fake_tensor").addFilter(_DuringCapture())


@contextlib.contextmanager
def _quiet_fake_kernel_errors():
    token = _CAPTURING.set(True)
    try:
        yield
    finally:
        _CAPTURING.reset(token)

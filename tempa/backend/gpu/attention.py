"""Recognise explicit attention and call ``scaled_dot_product_attention`` instead.

The pattern, on the torch-level graph the frontend hands us (nanoGPT, many research models):

    att = (q @ k.transpose(-2, -1)) * scale          # or / sqrt(d), or no scale
    att = att.masked_fill(mask_buf[..., :T, :T] == 0, float("-inf"))     # optional
    att = softmax(att, dim=-1)
    att = dropout(att, p)                            # p == 0 or not training: identity
    y = att @ v

becomes ``scaled_dot_product_attention(q, k, v, scale=scale, ...)``: flash/memory-efficient
kernels that never materialise the T x T matrix (at T=1024 that matrix is most of the
model's memory traffic). The mask becomes

  * ``is_causal=True`` when the sliced mask is lower-triangular at compile time. Why a guard:
    the mask is a module buffer passed to the graph on every call, and a user could change
    it; each call checks (``is`` + the tensor's ``_version`` counter, ~50 ns) that it is the
    same unmodified tensor, re-checks the values if not, and switches for good to the
    general variant below if it stopped being causal.
  * otherwise ``attn_mask=~(mask == 0)``: exact for any mask values.

Only chains whose intermediate values have no other readers are rewritten.
"""
from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..lower.trace import graph_module

_MATMUL = {operator.matmul, torch.matmul}
_SOFTMAX = {F.softmax, torch.softmax}


def _is_matmul(n):
    return (n.op == "call_function" and n.target in _MATMUL and len(n.args) == 2) or \
        (n.op == "call_method" and n.target == "matmul")


def _single_user(n):
    return len(n.users) == 1


def _is_transpose_last2(n, ndim_hint=4):
    if n.op == "call_method" and n.target == "transpose" and len(n.args) == 3:
        a, b = n.args[1], n.args[2]
        return {a, b} in ({-2, -1}, {ndim_hint - 2, ndim_hint - 1})
    if n.op == "call_function" and n.target is torch.transpose and len(n.args) == 3:
        return {n.args[1], n.args[2]} == {-2, -1}
    return False


def _scale_of(n):
    """(input node, scale) when ``n`` is x * c, c * x or x / c with a number c."""
    if n.op != "call_function" or len(n.args) != 2:
        return None
    a, b = n.args
    if n.target in (operator.mul, torch.mul):
        if isinstance(b, (int, float)) and isinstance(a, fx.Node):
            return a, float(b)
        if isinstance(a, (int, float)) and isinstance(b, fx.Node):
            return b, float(a)
    if n.target in (operator.truediv, torch.div) and isinstance(b, (int, float)) and b != 0:
        return a, 1.0 / float(b)
    return None


class _Match:
    def __init__(self, q, k, v, scale, mask_eq, out, chain):
        self.q, self.k, self.v, self.scale, self.mask_eq, self.out, self.chain = q, k, v, scale, mask_eq, out, chain


def _match(out: fx.Node):
    if not _is_matmul(out):
        return None
    att, v = out.args[0], out.args[1]
    chain = []
    # optional dropout
    if att.op == "call_function" and att.target is F.dropout:
        p = att.args[1] if len(att.args) > 1 else att.kwargs.get("p", 0.5)
        training = att.args[2] if len(att.args) > 2 else att.kwargs.get("training", True)
        if not isinstance(p, (int, float)) or (p != 0 and training is not False):
            return None
        chain.append(att)
        att = att.args[0]
    if not (att.op == "call_function" and att.target in _SOFTMAX):
        return None
    dim = att.kwargs.get("dim", att.args[1] if len(att.args) > 1 else None)
    if dim != -1 or att.kwargs.get("dtype") is not None:
        return None
    chain.append(att)
    x = att.args[0]
    mask_eq = None
    if x.op == "call_method" and x.target == "masked_fill" and len(x.args) == 3:
        fill = x.args[2]
        if not (isinstance(fill, float) and math.isinf(fill) and fill < 0):
            return None
        mask_eq = x.args[1]
        if not isinstance(mask_eq, fx.Node):
            return None
        chain.append(x)
        x = x.args[0]
    scale = 1.0
    sc = _scale_of(x)
    if sc is not None:
        chain.append(x)
        x, scale = sc
    if not _is_matmul(x):
        return None
    chain.append(x)
    q, kt = x.args[0], x.args[1]
    if not (isinstance(kt, fx.Node) and _is_transpose_last2(kt) and _single_user(kt)):
        return None
    chain.append(kt)
    k = kt.args[0]
    if any(not _single_user(n) for n in chain):
        return None
    return _Match(q, k, v, scale, mask_eq, out, chain)


def _mask_source(mask_eq: fx.Node, placeholders):
    """(placeholder index, slices) when mask_eq is ``ph[slices] == 0``."""
    if not (mask_eq.op == "call_function" and mask_eq.target in (operator.eq, torch.eq)
            and len(mask_eq.args) == 2 and mask_eq.args[1] == 0):
        return None
    g = mask_eq.args[0]
    if not (isinstance(g, fx.Node) and g.op == "call_function" and g.target is operator.getitem):
        return None
    src, sl = g.args
    if not (isinstance(src, fx.Node) and src.op == "placeholder" and src in placeholders):
        return None
    items = sl if isinstance(sl, tuple) else (sl,)
    for s in items:
        if isinstance(s, slice):
            if any(not (x is None or type(x) is int) for x in (s.start, s.step)):
                return None
            if not (s.stop is None or type(s.stop) is int or isinstance(s.stop, fx.Node)):
                return None
        elif s is not Ellipsis and s is not None and type(s) is not int:
            return None
    return placeholders.index(src), _widen(items)


def _widen(items):
    """The slices to check a mask buffer with. A symbolic length (``bias[:, :, :T, :T]`` with
    T a size symbol) is accepted only as the same prefix of the last two dims: then every
    such prefix is causal iff the whole square buffer is, which is what is checked."""
    sym = [s.stop for s in items if isinstance(s, slice) and isinstance(s.stop, fx.Node)]
    if not sym:
        return items if len(items) > 1 else items[0]
    last = items[-2:]
    if (len(items) < 2 or Ellipsis in items or len(set(sym)) != 1 or len(sym) != 2
            or not all(isinstance(s, slice) and s.stop is sym[0] and s.start in (None, 0) and s.step in (None, 1)
                       for s in last)):
        return None
    return tuple(items[:-2]) + (slice(None), slice(None))


def _causal(t: torch.Tensor, sl) -> bool:
    try:
        m = t[sl]
    except Exception:  # noqa: BLE001
        return False
    if m.dim() < 2 or m.shape[-1] != m.shape[-2] or any(s != 1 for s in m.shape[:-2]):
        return False
    T = m.shape[-1]
    keep = (m.reshape(T, T) != 0)
    want = torch.ones(T, T, dtype=torch.bool, device=m.device).tril()
    return bool(torch.equal(keep, want))


class CausalGuard:
    """Per-call check that each mask buffer is still the tensor found causal at compile time."""

    def __init__(self, entries):
        self.entries = entries      # [(arg index, slices, tensor, version)]

    def describe(self):
        return (f"attention: {len(self.entries)} explicit softmax(QK^T)V with a causal mask buffer "
                f"-> scaled_dot_product_attention(is_causal=True), guarded on the buffers")

    def wrap(self, fast, make_slow, info):
        # (arg index, slices, data_ptr, version counter): an alias of the same unmodified
        # buffer passes (views and detach() share the version counter)
        entries = [[i, sl, t.data_ptr(), t._version] for i, sl, t, _ in self.entries]
        state = {"slow": None}
        self.rechecks = 0

        def check(args):
            for e in entries:
                t = args[e[0]]
                if t.data_ptr() == e[2] and t._version == e[3]:
                    continue
                self.rechecks += 1
                if isinstance(t, torch.Tensor) and _causal(t, e[1]):
                    e[2], e[3] = t.data_ptr(), t._version
                    continue
                return False
            return True

        def compiled(*args):
            if state["slow"] is not None:
                return state["slow"](*args)
            if not check(args):
                info.notes.append("attention: a mask buffer changed and is no longer causal; "
                                  "switched to the general attention variant")
                state["slow"] = make_slow()
                return state["slow"](*args)
            return fast(*args)
        compiled.tempa_info = info
        for attr in ("tempa_cudagraphs",):
            if hasattr(fast, attr):
                setattr(compiled, attr, getattr(fast, attr))
        return compiled


def rewrite(gm: fx.GraphModule, example_inputs):
    """Returns (graph module, guard or None). The input module is never modified."""
    nodes = [n for n in gm.graph.nodes if _is_matmul(n)]
    matches = [m for m in (_match(n) for n in nodes) if m is not None]
    if not matches:
        return gm, None
    new = graph_module(gm, _copy_graph(gm.graph))     # code written only if it is called
    # map old nodes to new ones by position
    old_nodes = list(gm.graph.nodes)
    new_nodes = list(new.graph.nodes)
    pos = {n: i for i, n in enumerate(old_nodes)}
    placeholders = [n for n in new.graph.nodes if n.op == "placeholder"]
    entries = []
    for m in matches:
        q, k, v = (new_nodes[pos[x]] if isinstance(x, fx.Node) else x for x in (m.q, m.k, m.v))
        out = new_nodes[pos[m.out]]
        kwargs = {"scale": m.scale}
        if m.mask_eq is not None:
            eq = new_nodes[pos[m.mask_eq]]
            src = _mask_source(eq, placeholders)
            causal = False
            if src is not None and src[1] is not None and src[0] < len(example_inputs):
                t = example_inputs[src[0]]
                causal = isinstance(t, torch.Tensor) and _causal(t, src[1])
            if causal:
                kwargs["is_causal"] = True
                t = example_inputs[src[0]]
                entries.append((src[0], src[1], t, t._version))
            else:
                with new.graph.inserting_before(out):
                    keep = new.graph.call_function(torch.logical_not, (eq,))
                kwargs["attn_mask"] = keep
        with new.graph.inserting_before(out):
            sdpa = new.graph.call_function(F.scaled_dot_product_attention, (q, k, v), kwargs)
        out.replace_all_uses_with(sdpa)
        # erase the replaced chain (not a general dead-code pass: that would also drop unused
        # in-place method calls, which FX does not know to be impure)
        dead = [out] + [new_nodes[pos[c]] for c in m.chain]
        if m.mask_eq is not None:
            eq = new_nodes[pos[m.mask_eq]]
            dead += [eq] + [a for a in eq.all_input_nodes if a.op != "placeholder"]
        for n in dead:
            if not n.users and n.graph is new.graph:
                new.graph.erase_node(n)
    new.recompile()
    guard = CausalGuard(entries) if entries else None
    if guard is None:
        # every rewrite is exact (attn_mask or no mask): nothing to guard
        return new, _NoGuard(len(matches))
    return new, guard


class _NoGuard:
    def __init__(self, n):
        self.n = n

    def describe(self):
        return f"attention: {self.n} explicit softmax(QK^T)V -> scaled_dot_product_attention"

    def wrap(self, fast, make_slow, info):
        return fast


def _copy_graph(g: fx.Graph) -> fx.Graph:
    new = fx.Graph()
    env = {}
    for n in g.nodes:
        env[n] = new.node_copy(n, lambda a: env[a])
    return new

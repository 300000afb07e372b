"""A corpus of plain-Python functions for the resume-function differential harness.

Every function is deterministic; its observable side effects go to ``LOG`` (and to the
objects passed in), so "resume at offset k" can be compared with a full run. Loops that
the harness should enter use ``T(xs)`` (a tracked iterator, registered by the line that
created it) and ``with`` blocks use ``Rec`` (registered on ``__enter__``), so the harness
can hand the right iterator / bound ``__exit__`` to a resume function whose stack holds
them. Must not import torch: it runs on 3.12 and 3.13 too.

The ``Sym`` class and the ``*_forward`` functions at the end are torch-free copies of the
*shape* of real nn forwards (nanoGPT attention and GPT, a LLaMA attention with rotary
embeddings and ``**kwargs``, an MLP block): the same opcodes over symbolic values.
"""

import math
import sys

LOG = []
REG = {}
COUNTER = 0
SCALE = 3


def reset():
    global COUNTER
    LOG.clear()
    REG.clear()
    COUNTER = 0


class Stable:
    """Deterministic repr of the object's state (no addresses), for comparisons."""

    def __repr__(self):
        return f"{type(self).__name__}{sorted(vars(self).items())!r}"


class TIter:
    def __init__(self, xs, frame):
        self.items = list(xs)
        self.i = 0
        REG[("iter", frame.f_code.co_name, frame.f_lineno)] = self

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= len(self.items):
            raise StopIteration
        v = self.items[self.i]
        self.i += 1
        return v


def T(xs):
    return TIter(xs, sys._getframe(1))


class Rec:
    """A context manager that records enter/exit and swallows KeyError."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        f = sys._getframe(1)
        REG[("with", f.f_code.co_name, f.f_lineno)] = self
        LOG.append(("enter", self.name))
        return self.name.upper()

    def __exit__(self, et, ev, tb):
        LOG.append(("exit", self.name, et.__name__ if et else None))
        return et is KeyError


def helper(*args, sep="+", **kw):
    LOG.append(("helper", args, sep, tuple(sorted(kw.items()))))
    return sep.join(str(a) for a in args) + "".join(f"|{k}={v}" for k, v in sorted(kw.items()))


# ----------------------------------------------------------------------------------------
# 1. closures and cells
def closures(a, b):
    x = a * 2
    scale = SCALE

    def g(y):
        return x + y * scale

    def bump():
        nonlocal x
        x += 1
        return x

    LOG.append(("g", g(1)))
    r1 = bump()
    LOG.append(("after bump", x, g(2)))
    lam = lambda z: z - x  # noqa: E731
    r2 = lam(b)
    x = x + 10
    return r1, r2, g(3), lam(0), x


# 2. comprehensions
def comprehensions(xs, k):
    squares = [v * v for v in xs]
    LOG.append(("squares", squares))
    evens = {v: v // 2 for v in xs if v % 2 == 0}
    pairs = [(i, j) for i in range(3) for j in xs[:2] if i != j]
    uniq = {v % 3 for v in xs}
    total = sum(v * k for v in xs)
    nested = [[k * c for c in row] for row in [xs[:2], xs[2:]]]
    LOG.append(("nested", nested))
    return squares, evens, pairs, sorted(uniq), total, nested


# 3. f-strings
def fstrings(name, val, width=8, prec=2):
    s1 = f"{name}"
    s2 = f"{name!r}:{val:.3f}"
    LOG.append(s2)
    s3 = f"[{val:{width}.{prec}f}]"
    s4 = f"{name.upper()!s:>{width}}|{len(name)=}"
    s5 = f"{val!a}" + f"{'x' * 3}{{lit}}"
    return s1, s2, s3, s4, s5


# 4. keyword calls, *args, **kwargs
def kwargs_star(*args, **kwargs):
    r1 = helper(*args)
    r2 = helper(1, 2, sep="-")
    r3 = helper(*args, sep="/", **kwargs)
    merged = dict(**kwargs, extra=1)
    r4 = helper(0, *args[1:], **{"z": 9}, **kwargs)
    LOG.append(("merged", sorted(merged.items())))
    return r1, r2, r3, r4, len(args)


# 5. loops with break / continue / else
def loops(n):
    acc = []
    for i in T(range(n)):
        if i == 1:
            continue
        acc.append(i)
        LOG.append(("i", i))
        if i > 5:
            break
    else:
        acc.append("no-break")
    j = 0
    while j < n:
        j += 2
        if j == 4:
            continue
        LOG.append(("j", j))
    for a in T("ab"):
        for b in T([1, 2]):
            acc.append(f"{a}{b}")
    return acc, j


# 6. try / except / else / finally
def try_except(xs):
    out = []
    try:
        out.append(xs[0])
        LOG.append("in try")
        v = xs[10]
        out.append(v)
    except IndexError as e:
        LOG.append(("caught", type(e).__name__))
        out.append("idx")
    else:
        out.append("else")
    finally:
        LOG.append("finally")
    try:
        d = {"a": 1}
        out.append(d["a"])
        out.append(d["b"])
    except (KeyError, ValueError):
        out.append("key")
    try:
        try:
            int("x")
        finally:
            LOG.append("inner finally")
    except ValueError:
        out.append("value")
    return out


# 7. with blocks (custom context manager recording enter/exit)
def with_blocks(v):
    res = []
    with Rec("outer") as o:
        res.append(o)
        LOG.append(("body", v))
        with Rec("inner") as i:
            res.append(i)
            res.append(v * 2)
        res.append("between")
    with Rec("swallow"):
        res.append("before raise")
        raise KeyError("swallowed")
    for k in T([1, 2]):
        with Rec(f"loop{k}"):
            res.append(k)
    return res


# 8. walrus, early returns, short circuits
def walrus_returns(xs):
    if not xs:
        return "empty"
    if (n := len(xs)) > 5:
        LOG.append("long")
        return "long", n
    total = 0
    for x in xs:
        if (y := x * 2) > 6:
            LOG.append(("big", y))
            return "big", y, total
        total += y
    ok = total > 3 and n < 10 or total == 0
    label = "pos" if total > 0 else "nonpos"
    return 1 < total <= 100, ok, label, total


# 9. globals and module attributes
def globals_fn(x):
    global COUNTER
    COUNTER += x
    LOG.append(("counter", COUNTER))
    r = math.sqrt(x) * SCALE
    COUNTER = COUNTER * 2
    return r, COUNTER, helper(COUNTER)


# 10. generator expressions and lambdas inside expressions
def generator_exprs(xs):
    any_big = any(x > 2 for x in xs)
    LOG.append(("any", any_big))
    sq = tuple(x * x for x in xs if x)
    keyed = sorted(xs, key=lambda v: -v)
    first = next((x for x in xs if x > 1), None)
    return any_big, sq, keyed, first


# 11. unpacking, slicing, subscripts, del
def unpacking(seq):
    a, *rest = seq
    (p, q), r = (seq[0], seq[1]), seq[2:]
    LOG.append(("rest", rest))
    a, p = p, a
    d = {"k": 1, **{"m": 2}}
    d["n"] = 3
    del d["k"]
    lst = list(seq)
    lst[1:3] = [9, 9]
    tmp = lst[::-1]
    del tmp
    return a, p, q, r, sorted(d.items()), lst, seq[-1]


# 12. methods, attributes, zero-argument super()
class Base(Stable):
    def compute(self, x):
        LOG.append(("base", x))
        return x + 1


class Child(Base):
    def __init__(self):
        self.calls = 0

    def compute(self, x):
        self.calls += 1
        y = super().compute(x)
        LOG.append(("child", y))
        s = super()
        z = s.compute(y) * 2
        self.last = z
        return z, self.calls


# 13. conditionally bound locals (must stay unbound in a resume, as in the original)
def maybe_unbound(flag):
    if flag:
        y = 1
    LOG.append("after if")
    try:
        r = y + 1
    except UnboundLocalError:
        r = "unbound"
    z = 5
    del z
    return r


# 14. uncaught exception late in the function (checked with its traceback)
def raises_late(x):
    y = x + 1
    LOG.append(("y", y))
    if y > 0:
        raise ValueError(f"bad {y}")
    return y


# 15. while / for-else / nested functions defined late
def while_else(n):
    i = 0
    while i < n:
        i += 1
        if i == 100:
            break
    else:
        LOG.append("while-else")

    def inner(k):
        return [k + i for _ in range(2)]

    res = inner(3)
    for m in T(range(3)):
        res.append(m)
        if m == 1:
            LOG.append("found")
            break
    else:
        res.append("none")
    return res, i


# 16. a long function: many locals (EXTENDED_ARG on LOAD_FAST/STORE_FAST) and long jumps
def _make_long_function():
    lines = ["def long_function(x):"]
    for i in range(300):
        lines.append(f"    v{i} = x + {i}")
    lines.append("    if x > 0:")
    for i in range(0, 300, 3):
        lines.append(f"        v{i} = v{i} * 2 + v{i + 1}")
    lines.append("        LOG.append(('pos', v0, v297))")
    lines.append("    else:")
    lines.append("        LOG.append('neg')")
    lines.append("    total = 0")
    lines.append("    for k in T(range(3)):")
    lines.append("        total += v299 + k")
    lines.append("    return total + v0 + v150 + v298")
    src = "\n".join(lines) + "\n"
    ns = {}
    exec(compile(src, __file__ + ":long_function", "exec"), globals(), ns)
    return ns["long_function"]


long_function = _make_long_function()


# ----------------------------------------------------------------------------------------
# Torch-free analogues of nn forwards.
class Sym:
    """A symbolic 'tensor': an expression string and a shape."""

    def __init__(self, expr, shape):
        self.expr = expr
        self.shape = tuple(shape)

    def __repr__(self):
        return f"Sym({self.expr}, {self.shape})"

    @property
    def device(self):
        return "cpu"

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def view(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], tuple):
            shape = shape[0]
        shape = list(shape)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = math.prod(self.shape) // known
        return Sym(f"{self.expr}.view{tuple(shape)}", shape)

    reshape = view

    def transpose(self, a, b):
        s = list(self.shape)
        s[a], s[b] = s[b], s[a]
        return Sym(f"{self.expr}.T({a},{b})", s)

    def contiguous(self):
        return self

    def split(self, n, dim):
        k = self.shape[dim] // n
        out = []
        for i in range(k):
            s = list(self.shape)
            s[dim] = n
            out.append(Sym(f"{self.expr}[{i}]", s))
        return tuple(out)

    def __matmul__(self, o):
        return Sym(f"({self.expr}@{o.expr})", self.shape[:-1] + o.shape[-1:])

    def _bin(self, op, o):
        oe = o.expr if isinstance(o, Sym) else repr(o)
        return Sym(f"({self.expr}{op}{oe})", self.shape)

    def __add__(self, o):
        return self._bin("+", o)

    def __mul__(self, o):
        return self._bin("*", o)

    __rmul__ = __mul__

    def __neg__(self):
        return Sym(f"-{self.expr}", self.shape)

    def __eq__(self, o):
        return self._bin("==", o)

    __hash__ = None

    def __getitem__(self, idx):
        return Sym(f"{self.expr}[{idx!r}]", self.shape)

    def masked_fill(self, mask, value):
        return Sym(f"fill({self.expr},{mask.expr},{value})", self.shape)


class _F:
    @staticmethod
    def softmax(x, dim=-1):
        return Sym(f"softmax({x.expr},{dim})", x.shape)

    @staticmethod
    def gelu(x):
        return Sym(f"gelu({x.expr})", x.shape)

    @staticmethod
    def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
        LOG.append(("sdpa", dropout_p, is_causal))
        return Sym(f"sdpa({q.expr},{k.expr},{v.expr},{is_causal})", q.shape[:-1] + v.shape[-1:])

    @staticmethod
    def cross_entropy(a, b, ignore_index=-100):
        return Sym(f"ce({a.expr},{b.expr},{ignore_index})", ())


F = _F()


class Module(Stable):
    training = False

    def __call__(self, *args, **kwargs):
        LOG.append(("call", type(self).__name__, getattr(self, "name", "")))
        return self.forward(*args, **kwargs)


class Linear(Module):
    def __init__(self, name, n_in, n_out):
        self.name, self.n_in, self.n_out = name, n_in, n_out

    def forward(self, x):
        return Sym(f"{self.name}({x.expr})", x.shape[:-1] + (self.n_out,))


class Dropout(Module):
    def __init__(self, name, p):
        self.name, self.p = name, p

    def forward(self, x):
        return x if not self.training else Sym(f"drop({x.expr})", x.shape)


class Embedding(Module):
    def __init__(self, name, n, d):
        self.name, self.d = name, d

    def forward(self, idx):
        return Sym(f"{self.name}[{idx.expr}]", idx.shape + (self.d,))


def arange(a, b, dtype=None, device=None):
    return Sym(f"arange({a},{b},{dtype})", (b - a,))


class Config(Stable):
    def __init__(self, **kw):
        self.__dict__.update(kw)


class CausalSelfAttention(Module):
    def __init__(self, n_embd=8, n_head=2, flash=False, block=16):
        self.c_attn = Linear("c_attn", n_embd, 3 * n_embd)
        self.c_proj = Linear("c_proj", n_embd, n_embd)
        self.attn_dropout = Dropout("attn_drop", 0.1)
        self.resid_dropout = Dropout("resid_drop", 0.1)
        self.n_head, self.n_embd, self.dropout, self.flash = n_head, n_embd, 0.1, flash
        self.bias = Sym("tril", (1, 1, block, block))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True
            )
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        y = self.resid_dropout(self.c_proj(y))
        return y


class MLP(Module):
    def __init__(self, n_embd=8):
        self.c_fc = Linear("c_fc", n_embd, 4 * n_embd)
        self.c_proj = Linear("mlp_proj", 4 * n_embd, n_embd)
        self.dropout = Dropout("mlp_drop", 0.0)

    def forward(self, x):
        x = self.c_fc(x)
        x = F.gelu(x)
        x = self.c_proj(x)
        x = self.dropout(x)
        return x


class Block(Module):
    def __init__(self, i, n_embd=8):
        self.name = f"block{i}"
        self.ln_1 = Linear(f"ln1_{i}", n_embd, n_embd)
        self.attn = CausalSelfAttention(n_embd, flash=bool(i % 2))
        self.ln_2 = Linear(f"ln2_{i}", n_embd, n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(Module):
    def __init__(self, n_layer=2, n_embd=8, vocab=11, block_size=16):
        self.block_size = block_size
        self.wte = Embedding("wte", vocab, n_embd)
        self.wpe = Embedding("wpe", block_size, n_embd)
        self.drop = Dropout("drop", 0.0)
        self.h = [Block(i, n_embd) for i in range(n_layer)]
        self.ln_f = Linear("ln_f", n_embd, n_embd)
        self.lm_head = Linear("lm_head", n_embd, vocab)

    def forward(self, idx, targets=None):
        device = idx.device
        b, t = idx.size()
        assert t <= self.block_size, f"Cannot forward sequence of length {t}, block size is only {self.block_size}"
        pos = arange(0, t, dtype="long", device=device)
        tok_emb = self.wte(idx)
        pos_emb = self.wpe(pos)
        x = self.drop(tok_emb + pos_emb)
        for block in T(self.h):
            x = block(x)
        x = self.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss


def rotate_half(x):
    return Sym(f"rot({x.expr})", x.shape)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    attn_weights = (query @ key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = F.softmax(attn_weights, dim=-1)
    LOG.append(("eager_attn", dropout, tuple(sorted(kwargs))))
    attn_output = (attn_weights @ value).transpose(1, 2).contiguous()
    return attn_output, attn_weights


ATTENTION_FUNCTIONS = {"sdpa": lambda module, q, k, v, mask, **kw: (F.scaled_dot_product_attention(q, k, v), None)}


class Cache(Stable):
    def __init__(self):
        self.seen = []

    def update(self, k, v, layer_idx, cache_kwargs):
        self.seen.append((layer_idx, tuple(sorted(cache_kwargs))))
        return k, v


class LlamaAttention(Module):
    def __init__(self, impl="eager", layer_idx=0):
        self.config = Config(attn_implementation=impl, hidden_size=8, num_heads=2)
        self.head_dim = 4
        self.layer_idx = layer_idx
        self.scaling = self.head_dim ** -0.5
        self.attention_dropout = 0.0
        self.q_proj = Linear("q", 8, 8)
        self.k_proj = Linear("k", 8, 8)
        self.v_proj = Linear("v", 8, 8)
        self.o_proj = Linear("o", 8, 8)

    def forward(self, hidden_states, position_embeddings, attention_mask=None, past_key_value=None, cache_position=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if past_key_value is not None:
            cache_kwargs = {"sin": sin, "cos": cos, "cache_position": cache_position}
            key_states, value_states = past_key_value.update(key_states, value_states, self.layer_idx, cache_kwargs)
        attention_interface = eager_attention_forward
        if self.config.attn_implementation != "eager":
            attention_interface = ATTENTION_FUNCTIONS[self.config.attn_implementation]
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **kwargs,
        )
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.o_proj(attn_output)
        return attn_output, attn_weights


# ----------------------------------------------------------------------------------------
# The cases: name -> (function, factory of fresh positional args, kwargs)
def _x(*shape):
    return Sym("x", shape)


CASES = {
    "closures": (closures, lambda: ((3, 4), {})),
    "comprehensions": (comprehensions, lambda: (([1, 2, 3, 4, 5], 2), {})),
    "fstrings": (fstrings, lambda: (("bob", 3.14159), {"width": 9})),
    "kwargs_star": (kwargs_star, lambda: ((1, 2, 3), {"a": 1, "b": "q"})),
    "loops": (loops, lambda: ((9,), {})),
    "try_except": (try_except, lambda: (([7, 8],), {})),
    "with_blocks": (with_blocks, lambda: ((5,), {})),
    "walrus_returns": (walrus_returns, lambda: (([1, 2, 5, 1],), {})),
    "walrus_returns_long": (walrus_returns, lambda: (([1, 2, 3, 4, 5, 6],), {})),
    "walrus_returns_small": (walrus_returns, lambda: (([1, 1],), {})),
    "globals_fn": (globals_fn, lambda: ((4,), {})),
    "generator_exprs": (generator_exprs, lambda: (([3, 0, 1, 2],), {})),
    "unpacking": (unpacking, lambda: (([1, 2, 3, 4, 5],), {})),
    "child_super": (Child.compute, lambda: ((Child(), 5), {})),
    "maybe_unbound_true": (maybe_unbound, lambda: ((True,), {})),
    "maybe_unbound_false": (maybe_unbound, lambda: ((False,), {})),
    "raises_late": (raises_late, lambda: ((2,), {})),
    "while_else": (while_else, lambda: ((4,), {})),
    "long_function": (long_function, lambda: ((2,), {})),
    "attn_explicit": (CausalSelfAttention.forward, lambda: ((CausalSelfAttention(), _x(2, 5, 8)), {})),
    "attn_flash": (CausalSelfAttention.forward, lambda: ((CausalSelfAttention(flash=True), _x(2, 5, 8)), {})),
    "gpt": (GPT.forward, lambda: ((GPT(), Sym("idx", (2, 5))), {})),
    "gpt_targets": (GPT.forward, lambda: ((GPT(), Sym("idx", (2, 5))), {"targets": Sym("tgt", (2, 5))})),
    "mlp_block": (Block.forward, lambda: ((Block(0), _x(2, 5, 8)), {})),
    "llama_attn": (
        LlamaAttention.forward,
        lambda: (
            (LlamaAttention(), _x(2, 5, 8), (Sym("cos", (5, 4)), Sym("sin", (5, 4)))),
            {"attention_mask": Sym("mask", (2, 1, 5, 5)), "past_key_value": Cache(), "cache_position": 3, "foo": 1},
        ),
    ),
    "llama_attn_sdpa": (
        LlamaAttention.forward,
        lambda: ((LlamaAttention("sdpa"), _x(2, 5, 8), (Sym("cos", (5, 4)), Sym("sin", (5, 4)))), {}),
    ),
}

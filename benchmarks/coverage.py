"""Coverage of the Python real programs run (issue 16): tempa and torch.compile side by side
on the same programs, one run, one process, capture only (tempa's "eager" backend and a
torch.compile backend that counts graphs and runs them as FX code), so the table compares
what each frontend captures, not kernels.

    python benchmarks/coverage.py [--out FILE] [-k SUBSTRING]

Each program is a small generator function of one argument, ``compile``: it builds its
state, compiles what it compiles with ``compile(fn, fullgraph=...)``, and yields the values
of its first call, then those of a second call with new values. It runs three times, from
the same seed: eagerly (``compile`` returns the function itself), under tempa and under
torch.compile. Per system the table gives the graphs captured, the graph breaks, the eager
fallbacks (tempa.stats(); torch.compile has no such counter: "-"), the graphs captured
again by the second call, and whether both calls' values equal eager's. A program is
captured *whole* when it ran without an error, with no break and no eager fallback.
Each item ends with "tempa captures whole everything torch.compile captures whole: N of M"
(M: the programs torch.compile captures whole with eager's values) and the findings: the
programs where tempa breaks, falls back or recaptures more than torch.compile, or differs
from eager.

torch.compile runs with its default settings, except for item 7 (data-dependent values),
where it gets ``capture_scalar_outputs`` and ``capture_dynamic_output_shape_ops``, the
settings tempa's behaviour corresponds to.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import dataclasses
import enum
import functools
import itertools
import operator
import os
import pickle
import sys
import time
import warnings

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import tempa  # noqa: E402

PROGRAMS: list[tuple[str, object]] = []   # (item, program), in the table's order
DYNAMO_CONFIG: dict[str, dict] = {}       # item -> torch._dynamo.config settings for it


def program(item: str):
    def register(fn):
        PROGRAMS.append((item, fn))
        return fn
    return register


# ---------------------------------------------------------------------------------------
# 1. Side effects as data
# ---------------------------------------------------------------------------------------
SIDE = "1. side effects"


class _Box:
    pass


@program(SIDE)
def module_counter(compile):
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.n = 0
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            self.n += 1
            return self.lin(x) * self.n

    m = Counter()
    fast = compile(m)
    yield fast(torch.randn(2, 4)), m.n
    yield fast(torch.randn(2, 4)), m.n


@program(SIDE)
def ema_buffers(compile):
    class EMA(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("avg", torch.zeros(3))
            self.register_buffer("avg2", torch.zeros(3))

        def forward(self, x):
            self.avg.mul_(0.5).add_(x)
            self.avg2 = self.avg2 * 0.5 + x
            return self.avg + self.avg2

    m = EMA()
    fast = compile(m)
    for _ in range(2):
        yield fast(torch.randn(3)), m.avg.clone(), m.avg2.clone()


@program(SIDE)
def kv_cache_dict_on_module(compile):
    class Cached(nn.Module):
        def __init__(self):
            super().__init__()
            self.cache = {}

        def forward(self, x, key):
            self.cache[key] = x.sin()
            return x + len(self.cache)

    m = Cached()
    fast = compile(m)
    yield fast(torch.randn(3), "a"), sorted(m.cache)
    yield fast(torch.randn(3), "b"), sorted(m.cache)


@program(SIDE)
def append_to_outside_list(compile):
    out = []

    def f(x):
        out.append(x.cos())
        return x + 1

    fast = compile(f)
    yield fast(torch.randn(3)), list(out)
    yield fast(torch.randn(3)), list(out)


COUNTER = 0


@program(SIDE)
def global_and_nonlocal(compile):
    calls = 0

    def f(x):
        global COUNTER
        nonlocal calls
        COUNTER += 1
        calls += 1
        return x * calls

    global COUNTER
    COUNTER = 0
    fast = compile(f)
    yield fast(torch.randn(3)), COUNTER, calls
    yield fast(torch.randn(3)), COUNTER, calls


@program(SIDE)
def caller_dict_methods(compile):
    def f(x, d):
        del d["a"]
        d.update(c=x * 3)
        v = d.pop("b")
        d.setdefault("e", 7)
        return x + v + d["e"]

    fast = compile(f)
    for _ in range(2):
        d = {"a": 1, "b": 2, "z": 0}
        yield fast(torch.randn(3), d), d


@program(SIDE)
def setattr_delattr_outside_object(compile):
    def f(x, box):
        box.t = x * 2
        del box.old
        return box.t + 1

    fast = compile(f)
    for _ in range(2):
        box = _Box()
        box.old = 1
        yield fast(torch.randn(3), box), vars(box)


# ---------------------------------------------------------------------------------------
# 2. HF generate with a compiled forward
# ---------------------------------------------------------------------------------------
HF = "2. HF generate"


def _hf_model(kind: str):
    import transformers
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                      n_positions=128, bos_token_id=0, eos_token_id=None)
        return transformers.GPT2LMHeadModel(cfg).eval()
    config = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
              "qwen2": transformers.Qwen2Config}[kind]
    cfg = config(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                 max_position_embeddings=128, bos_token_id=0, eos_token_id=None)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def _generate(kind: str, cache: str):
    def run(compile):
        model = _hf_model(kind)
        model.forward = compile(model.forward, fullgraph=cache == "static")
        kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
        if cache == "static":
            kw["cache_implementation"] = "static"
        for seed in (1, 2):   # the second generate(): new prompt, new cache object
            ids = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(seed))
            with torch.no_grad():
                yield model.generate(ids, **kw)
    run.__name__ = f"{kind}_{cache}_cache" + ("_fullgraph" if cache == "static" else "")
    return run


for _kind, _cache in (("gpt2", "dynamic"), ("llama", "dynamic"), ("qwen2", "dynamic"),
                      ("mistral", "dynamic"), ("gpt2", "static"), ("llama", "static")):
    program(HF)(_generate(_kind, _cache))


# ---------------------------------------------------------------------------------------
# 3. Compiled optimizers: 2 steps (state made, state read), then 8 more
# ---------------------------------------------------------------------------------------
OPT = "3. optimizers"


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _optimizer_steps(name, make, fullgraph=False):
    def run(compile):
        model = _mlp()
        opt = make(model.parameters())
        step = compile(opt.step, fullgraph=fullgraph)
        x = torch.randn(16, 4)

        def steps(n):
            for _ in range(n):
                model(x).pow(2).mean().backward()
                step()
                opt.zero_grad()
            return [p.detach().clone() for p in model.parameters()]
        yield steps(2)
        yield steps(8)
    run.__name__ = name
    return run


for _name, _make, _full in (
        ("sgd_momentum", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=False), 0),
        ("sgd_nesterov_foreach", lambda p: torch.optim.SGD(
            p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, foreach=True), 0),
        ("adam", lambda p: torch.optim.Adam(p, lr=0.01, foreach=False), 0),
        ("adam_foreach", lambda p: torch.optim.Adam(p, lr=0.01, foreach=True), 0),
        ("adamw_foreach", lambda p: torch.optim.AdamW(p, lr=0.01, foreach=True), 0),
        ("rmsprop", lambda p: torch.optim.RMSprop(p, lr=0.01, foreach=False), 0),
        ("adam_fullgraph", lambda p: torch.optim.Adam(p, lr=0.01, foreach=True), 1)):
    program(OPT)(_optimizer_steps(_name, _make, fullgraph=bool(_full)))


@program(OPT)
def train_step_function(compile):
    def train_step(model, opt, x, y):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    fast = compile(train_step)
    x, y = torch.randn(16, 4), torch.randn(16, 2)
    yield [fast(model, opt, x, y) for _ in range(2)]
    yield [fast(model, opt, x, y) for _ in range(8)], [p.detach().clone() for p in model.parameters()]


# ---------------------------------------------------------------------------------------
# 4. Higher-order constructs
# ---------------------------------------------------------------------------------------
HIGHER = "4. higher-order"


def _value_and_grad(fn, x):
    x = x.detach().clone().requires_grad_()
    out = fn(x)
    out.backward()
    return out.detach(), x.grad


@torch.compiler.disable
def _disabled(x):
    return x.sum().item() + 1


@program(HIGHER)
def compiler_disable(compile):
    def f(x):
        y = x * 2
        return y + _disabled(y)

    fast = compile(f)
    yield fast(torch.randn(4))
    yield fast(torch.randn(4))


class _StraightThroughRound(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return torch.round(x * scale)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


@program(HIGHER)
def autograd_function(compile):
    fast = compile(lambda x: _StraightThroughRound.apply(x.sin(), 3.0).cos().sum())
    yield _value_and_grad(fast, torch.randn(5))
    yield _value_and_grad(fast, torch.randn(5))


@program(HIGHER)
def checkpoint_non_reentrant(compile):
    from torch.utils.checkpoint import checkpoint
    lin = nn.Linear(4, 4)

    def block(x):
        return torch.relu(lin(x)) * 2

    fast = compile(lambda x: checkpoint(block, x.sin(), use_reentrant=False).cos().sum())
    yield _value_and_grad(fast, torch.randn(3, 4))
    yield _value_and_grad(fast, torch.randn(3, 4))


@torch.library.custom_op("coverage::scaled_sin", mutates_args=())
def _scaled_sin(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x.sin() * scale


@_scaled_sin.register_fake
def _(x, scale):
    return torch.empty_like(x)


@program(HIGHER)
def custom_op(compile):
    fast = compile(lambda x: _scaled_sin(x * 2, 0.5).cos().sum())
    yield fast(torch.randn(6))
    yield fast(torch.randn(6))


@program(HIGHER)
def cond_on_a_tensor(compile):
    w = torch.randn(3)

    def f(x, flag):
        return torch.cond(flag, lambda t: t.sin() * w, lambda t: t.cos() + w, (x,)).sum()

    fast = compile(f)
    yield fast(torch.randn(3), torch.tensor(True))
    yield fast(torch.randn(3), torch.tensor(False))


@program(HIGHER)
def vmap_grad_jacrev(compile):
    v = torch.randn(4)

    def loss(p, x):
        return ((x * p).sin() * v).sum()

    def f(x, p):
        per_row = torch.vmap(lambda r: (r * v).cos() + r.sum())(x)
        return per_row, torch.func.grad(loss)(p, x[0]), torch.func.jacrev(torch.sin)(p)

    fast = compile(f)
    yield fast(torch.randn(3, 4), torch.randn(4))
    yield fast(torch.randn(3, 4), torch.randn(4))


@program(HIGHER)
def functional_call(compile):
    lin = nn.Linear(3, 2)

    def f(x, params):
        return torch.func.functional_call(lin, params, (x,)).sin()

    fast = compile(f)
    for _ in range(2):
        params = {k: torch.randn_like(v) for k, v in lin.named_parameters()}
        yield fast(torch.randn(4, 3), params)


# ---------------------------------------------------------------------------------------
# 5. The standard library
# ---------------------------------------------------------------------------------------
STDLIB = "5. stdlib"


@program(STDLIB)
def itertools_chain_pairwise(compile):
    def f(x, y):
        return sum(itertools.chain([x, y], (x * 2,))), [a - b for a, b in itertools.pairwise([x, y, x])]

    fast = compile(f)
    yield fast(torch.randn(4), torch.randn(4))
    yield fast(torch.randn(4), torch.randn(4))


@program(STDLIB)
def functools_reduce_partial(compile):
    def f(x, y):
        return functools.reduce(operator.add, [x, y, x]), functools.partial(torch.add, alpha=2)(x, y)

    fast = compile(f)
    yield fast(torch.randn(4), torch.randn(4))
    yield fast(torch.randn(4), torch.randn(4))


@program(STDLIB)
def operator_getters(compile):
    def f(x, y):
        return operator.itemgetter(1)([x, y]) + 1, x.reshape(operator.attrgetter("shape")(y)), \
            operator.methodcaller("add", y, alpha=2)(x)

    fast = compile(f)
    yield fast(torch.randn(4), torch.randn(4))
    yield fast(torch.randn(4), torch.randn(4))


@program(STDLIB)
def namedtuple_defined_inside(compile):
    def f(x):
        Pair = collections.namedtuple("Pair", "a b")
        p = Pair(x, x * 2)
        return p.a + p.b, p._replace(a=x)[0]

    fast = compile(f)
    yield fast(torch.randn(4))
    yield fast(torch.randn(4))


@program(STDLIB)
def deque_defaultdict_counter(compile):
    def f(x, y):
        d = collections.deque([x, y], maxlen=3)
        d.append(x * 3)
        d.appendleft(y)
        groups = collections.defaultdict(list)
        groups["a"].append(x)
        groups["a"].append(y)
        c = collections.Counter("abca")
        return d.popleft() + groups["a"][1] * c["a"], list(d)

    fast = compile(f)
    yield fast(torch.randn(4), torch.randn(4))
    yield fast(torch.randn(4), torch.randn(4))


@dataclasses.dataclass
class _Point:
    a: torch.Tensor
    b: int = 2


class _Color(enum.Enum):
    RED = 1
    GREEN = 2


@program(STDLIB)
def dataclass_enum_match(compile):
    def f(x):
        p = _Point(x)
        match p:
            case _Point(a, b=3):
                return a
            case _Point(a, b=b):
                return a * b * _Color.GREEN.value if _Color(1) is _Color.RED else a

    fast = compile(f)
    yield fast(torch.randn(4))
    yield fast(torch.randn(4))


@contextlib.contextmanager
def _logged(log):
    log.append("enter")
    try:
        yield 3
    finally:
        log.append("exit")


@program(STDLIB)
def contextmanager(compile):
    def f(x):
        log = []
        with _logged(log) as n:
            z = x * n
        return z + len(log), log

    fast = compile(f)
    yield fast(torch.randn(4))
    yield fast(torch.randn(4))


@program(STDLIB)
def generator_map_filter_zip(compile):
    def f(x, y):
        def scaled():
            for i in range(3):
                yield x * i
        kept = list(map(lambda t: t + 1, filter(lambda t: t is not y, [x, y])))
        return sum(scaled()), kept, [a * b for a, b in zip([x, y], [y, x])]

    fast = compile(f)
    yield fast(torch.randn(4), torch.randn(4))
    yield fast(torch.randn(4), torch.randn(4))


# ---------------------------------------------------------------------------------------
# 6. numpy in forward
# ---------------------------------------------------------------------------------------
NUMPY = "6. numpy"


@program(NUMPY)
def numpy_on_tensor_data(compile):
    def f(x):
        a = x.numpy()
        b = np.sin(a) * 2 + a.sum(axis=0)
        return torch.from_numpy(b.T) + 1, np.sum(a), b[0, 1]

    fast = compile(f)
    yield fast(torch.randn(3, 4))
    yield fast(torch.randn(3, 4))


@program(NUMPY)
def ndarray_arguments(compile):
    fast = compile(lambda a, b: a @ b.T + np.float32(2.5))
    yield fast(np.ones((2, 3)), np.arange(6.0).reshape(2, 3))
    yield fast(np.random.rand(2, 3), np.random.rand(2, 3))


@program(NUMPY)
def numpy_constants(compile):
    ones = np.ones(3, dtype=np.float32)

    def f(x):
        return x * np.float32(2.5) + torch.from_numpy(ones) + np.int64(3)

    fast = compile(f)
    yield fast(torch.randn(3))
    yield fast(torch.randn(3))


@program(NUMPY)
def numpy_rows_and_tolist(compile):
    fast = compile(lambda x: ([r.sum() for r in x.numpy()], x.numpy()[0].tolist()))
    yield fast(torch.randn(2, 3))
    yield fast(torch.randn(2, 3))


# ---------------------------------------------------------------------------------------
# 7. Data-dependent values
# ---------------------------------------------------------------------------------------
DATA = "7. data-dependent"
DYNAMO_CONFIG[DATA] = dict(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True)


@program(DATA)
def item_into_arithmetic(compile):
    def f(x, t):
        v = t.item()
        return x * (v * 2 + 1) - v / 4

    fast = compile(f)
    yield fast(torch.arange(6.0), torch.tensor(2.0))
    yield fast(torch.arange(6.0), torch.tensor(-3.5))


@program(DATA)
def int_cast_into_ops(compile):
    fast = compile(lambda x, t: x + int(t) * 3)
    yield fast(torch.arange(6.0), torch.tensor(2.0))
    yield fast(torch.arange(6.0), torch.tensor(-3.0))


@program(DATA)
def branch_on_item(compile):
    def f(x, t):
        if t.item() > 0:
            return x + 1
        return x - 1

    fast = compile(f)
    yield fast(torch.arange(6.0), torch.tensor(2.0))
    yield fast(torch.arange(6.0), torch.tensor(-3.0))


@program(DATA)
def arange_and_slice_of_item(compile):
    def f(x, t):
        n = t.item()
        torch._check(n >= 0)
        torch._check(n <= x.shape[0])
        return torch.arange(n, dtype=torch.float32) + x[:n]

    fast = compile(f)
    yield fast(torch.randn(8), torch.tensor(3))
    yield fast(torch.randn(8), torch.tensor(6))


@program(DATA)
def value_sized_ops(compile):
    def f(x):
        u = torch.unique_consecutive(x)
        return u * 2, x[x > 2]

    fast = compile(f)
    yield fast(torch.tensor([1, 1, 2, 2, 1, 3]))
    yield fast(torch.tensor([4, 5, 6, 7, 8, 9]))


# ---------------------------------------------------------------------------------------
# 8. Any callable, and a wrapper that behaves like the module
# ---------------------------------------------------------------------------------------
CALLABLES = "8. callables"


class _Scaler:
    def __init__(self, k):
        self.k = k

    def __call__(self, a):
        return a.cos() * self.k


@functools.lru_cache
def _cached_sin(a):
    return a.sin()


def _two_calls(fn, *shapes):
    def run(compile):
        fast = compile(fn)
        for _ in range(2):
            yield fast(*[torch.randn(s) for s in shapes])
    return run


for _name, _fn, _shapes in (
        ("builtin_torch_sin", torch.sin, [(3, 4)]),
        ("partial_of_builtin", functools.partial(torch.add, alpha=2), [(3, 4), (3, 4)]),
        ("lru_cache_function", _cached_sin, [(3, 4)]),
        ("object_with_call", _Scaler(2.0), [(3, 4)]),
        ("bound_method", _Scaler(2.0).__call__, [(3, 4)]),
        ("first_parameter_named_self", lambda self, x: self * 2 + x, [(3,), (3,)])):
    _run = _two_calls(_fn, *_shapes)
    _run.__name__ = _name
    program(CALLABLES)(_run)


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        return self.bn(self.fc(x))


@program(CALLABLES)
def module_wrapper_behaves_like_module(compile):
    model = _Net().eval()
    fast = compile(model)
    yield fast(torch.randn(5, 4)), bool(fast), fast.training, list(fast.state_dict())
    twin = copy.deepcopy(fast)
    yield twin(torch.randn(5, 4)), pickle.loads(pickle.dumps(fast))(torch.ones(5, 4))


@program(CALLABLES)
def lazy_module(compile):
    model = nn.Sequential(nn.LazyLinear(3), nn.ReLU())
    fast = compile(model)
    yield fast(torch.randn(2, 5))
    yield fast(torch.randn(2, 5))


# ---------------------------------------------------------------------------------------
# The systems and the run
# ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class Outcome:
    graphs: int = 0
    breaks: int = 0
    fallbacks: int | None = 0
    second_call_graphs: int = 0
    values: list = dataclasses.field(default_factory=list)
    error: str | None = None
    equal: bool | None = None

    @property
    def whole(self) -> bool:
        return self.error is None and self.breaks == 0 and not self.fallbacks


class Eager:
    name = "eager"

    def reset(self):
        pass

    def compile(self, fn, fullgraph=False):
        return fn

    def counts(self):
        return 0, 0, 0


class Tempa:
    name = "tempa"

    def reset(self):
        tempa.reset()

    def compile(self, fn, fullgraph=False):
        return tempa.compile(fn, fullgraph=fullgraph, backend="eager")

    def counts(self):
        s = tempa.stats()
        return s.captures, s.graph_breaks, s.eager_fallbacks


class TorchCompile:
    """torch.compile with a backend that counts the graphs Dynamo hands it and runs each as
    its FX code; breaks from Dynamo's own counters: "graph_break" (a break Dynamo resumes
    after: graph_break(), a disabled call) and "unimplemented" (a break at what it cannot
    trace, a data-dependent branch), which count different breaks."""
    name = "torch.compile"

    def __init__(self):
        self.graphs = 0

    def _backend(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward

    def reset(self):
        from torch import _dynamo
        _dynamo.reset()
        _dynamo.utils.counters.clear()
        self.graphs = 0

    def compile(self, fn, fullgraph=False):
        return torch.compile(fn, fullgraph=fullgraph, backend=self._backend)

    def counts(self):
        from torch._dynamo.utils import counters
        breaks = sum(counters["graph_break"].values()) + sum(counters["unimplemented"].values())
        return self.graphs, breaks, None


def run(prog, system, dynamo_config) -> Outcome:
    system.reset()
    torch.manual_seed(0)
    np.random.seed(0)
    out = Outcome()
    patch = contextlib.nullcontext()
    if isinstance(system, TorchCompile) and dynamo_config:
        from torch._dynamo import config
        patch = config.patch(**dynamo_config)
    with patch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calls = prog(system.compile)
        try:
            out.values.append(next(calls))
            after_first = system.counts()[0]
            out.values.append(next(calls))
        except Exception as e:   # a refusal (fullgraph) or a crash: the row says which
            out.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:90]
            after_first = None
        out.graphs, out.breaks, out.fallbacks = system.counts()
        if after_first is not None:
            out.second_call_graphs = out.graphs - after_first
    system.reset()
    return out


def same(a, b) -> bool:
    """Equal values of the same types, all the way down (float tolerance for tensors)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return (a.shape == b.shape and a.dtype == b.dtype
                and torch.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True))
    if isinstance(a, (np.ndarray, np.generic)):
        return a.dtype == b.dtype and np.shape(a) == np.shape(b) and np.allclose(a, b, rtol=1e-5)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(u, v) for u, v in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return abs(a - b) <= 1e-5 * max(1.0, abs(a))
    return a == b


def _cell(o: Outcome) -> list[str]:
    if o.error:
        return [o.error.replace("|", "/"), "", "", "", "no"]
    return [str(o.graphs), str(o.breaks), "-" if o.fallbacks is None else str(o.fallbacks),
            str(o.second_call_graphs), "yes" if o.equal else "no"]


def _finding(t: Outcome, d: Outcome) -> str:
    if not t.equal:
        return "tempa differs from eager" if t.error is None else "tempa fails"
    if d.error is not None or not d.equal:
        return ""
    worse = [what for what, a, b in (("breaks", t.breaks, d.breaks),
                                      ("fallbacks", t.fallbacks or 0, 0),
                                      ("recaptures", t.second_call_graphs, d.second_call_graphs))
             if a > b]
    return "tempa " + ", ".join(worse) + " more" if worse else ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the Markdown table to this file")
    parser.add_argument("-k", default="", help="only the programs whose item or name has this")
    args = parser.parse_args()
    systems = Eager(), Tempa(), TorchCompile()
    start = time.perf_counter()
    lines = ["| program | tempa graphs | breaks | fallbacks | 2nd call | = eager "
             "| torch.compile graphs | breaks | fallbacks | 2nd call | = eager | finding |",
             "|---|" + "---|" * 11]
    summaries, item, rows = [], None, []

    def close_item():
        if item is None:
            return
        theirs = [r for r in rows if r[1].whole and r[1].equal]
        ours = [r for r in theirs if r[0].whole and r[0].equal]
        beyond = [r for r in rows if r[0].whole and r[0].equal and not (r[1].whole and r[1].equal)]
        summaries.append(f"{item}: tempa captures whole everything torch.compile captures "
                         f"whole: {len(ours)} of {len(theirs)} (and {len(beyond)} more that "
                         f"torch.compile does not); findings: {sum(bool(r[2]) for r in rows)}")

    for prog_item, prog in PROGRAMS:
        if args.k not in prog_item and args.k not in prog.__name__:
            continue
        if prog_item != item:
            close_item()
            item, rows = prog_item, []
            lines.append(f"| **{item}** |" + " |" * 11)
        reference, *compiled = [run(prog, s, DYNAMO_CONFIG.get(prog_item)) for s in systems]
        for o in compiled:
            o.equal = reference.error is None and o.error is None and same(o.values, reference.values)
        t, d = compiled
        finding = _finding(t, d)
        rows.append((t, d, finding))
        lines.append(f"| {prog.__name__} | " + " | ".join(_cell(t) + _cell(d) + [finding]) + " |")
        print(lines[-1], file=sys.stderr, flush=True)
    close_item()
    elapsed = time.perf_counter() - start
    text = "\n".join(lines + [""] + [f"- {s}" for s in summaries]
                     + ["", f"({len(PROGRAMS)} programs, {elapsed:.0f} s, torch {torch.__version__}, "
                            f"load average {os.getloadavg()[0]:.1f})"])
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

"""numpy in captured code (capture/numpy_values.py): numpy calls on tensor data are graph
operations (through torch._numpy), as torch.compile traces them; results are real ndarrays
and numpy scalars with eager's values and types; ndarray inputs are guarded like tensors;
what has no torch equivalent is one clean graph break. The capture/break counts are those
torch.compile (CompileCounter) gives on the same code, unless a test says otherwise."""
import numpy as np
import pytest
import torch

import tempa

GLOBAL_ARRAY = np.arange(4.0)


def _counts():
    s = tempa.stats()
    return s.captures, s.graph_breaks, s.recompiles, s.eager_fallbacks


def _same(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _same(u, v)
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and np.shape(a) == np.shape(b)
        np.testing.assert_allclose(a, b, rtol=1e-6)
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b)
    else:
        assert a == b


def test_numpy_on_tensor_data_is_one_graph_with_eager_types():
    def f(x):
        a = x.numpy()
        b = np.sin(a) * 2 + a.sum(axis=0)
        return torch.from_numpy(b.T) + 1, np.sum(a), a.mean(), b, a.shape, a.dtype, b[0, 1]

    fast = tempa.compile(f, fullgraph=True)
    for _ in range(2):   # new values: no recompile
        x = torch.randn(3, 4)
        _same(f(x), fast(x))
    assert _counts() == (1, 0, 0, 0)   # torch.compile: 1 frame (it refuses a.dtype)


def test_ndarray_inputs_are_guarded_like_tensors_and_returned_as_themselves():
    def f(a, b):
        return a @ b.T, a

    fast = tempa.compile(f, fullgraph=True, backend="eager")
    a, b = np.ones((2, 3)), np.arange(6.0).reshape(2, 3)
    out = fast(a, b)
    _same(f(a, b), out)
    assert out[1] is a
    _same(f(b, a), fast(b, a))                          # same layout: no recompile
    assert _counts() == (1, 0, 0, 0)
    c = np.ones((2, 3), dtype=np.float32)               # a new dtype is a new graph
    _same(f(c, c), fast(c, c))
    assert tempa.stats().captures == 2


def test_writes_into_an_array_reach_the_callers_memory():
    def f(a):
        a += 1
        a[0] = -5.0
        return a

    fast = tempa.compile(f, fullgraph=True)
    a, ref = np.ones(3), np.ones(3)
    assert fast(a) is a
    f(ref)
    np.testing.assert_array_equal(a, ref)
    assert _counts() == (1, 0, 0, 0)


def test_tensor_numpy_shares_the_tensors_memory():
    fast = tempa.compile(lambda x: x.numpy(), fullgraph=True, backend="eager")
    x = torch.zeros(3)
    a = fast(x)
    assert type(a) is np.ndarray
    a[1] = 7.0
    assert x[1].item() == 7.0
    assert _counts() == (1, 0, 0, 0)


def test_numpy_constants_and_globals_in_the_graph():
    def f(x):
        return x * np.float32(2.5) + torch.from_numpy(np.ones(3, dtype=np.float32)) + np.int64(3)

    fast = tempa.compile(f, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(fast(x), f(x))

    def g(x):
        return x + torch.from_numpy(GLOBAL_ARRAY)

    fast_g = tempa.compile(g, fullgraph=True, backend="eager")
    x = torch.ones(4, dtype=torch.float64)
    torch.testing.assert_close(fast_g(x), g(x))
    GLOBAL_ARRAY[0] = 100.0   # read live on every call, never baked in
    torch.testing.assert_close(fast_g(x), g(x))
    assert _counts() == (2, 0, 0, 0)


def test_a_returned_constant_array_is_fresh_on_every_call():
    fast = tempa.compile(lambda: np.zeros(3), fullgraph=True, backend="eager")
    first = fast()
    first[0] = 1.0
    np.testing.assert_array_equal(fast(), np.zeros(3))
    assert _counts() == (1, 0, 0, 0)


def test_equal_dtypes_made_differently_are_one_graph():
    def f(a, dt):
        return a + np.finfo(dt).max

    fast = tempa.compile(f, backend="eager")
    a = torch.zeros(3)
    for dt in (np.dtype(np.float32), np.ones(1, dtype=np.float32).dtype, np.dtype("float32")):
        torch.testing.assert_close(fast(a, dt), f(a, dt))
    assert _counts() == (1, 0, 0, 0)
    torch.testing.assert_close(fast(a, np.dtype("float16")), f(a, np.dtype("float16")))
    assert tempa.stats().captures == 2


def test_iterating_an_array_gives_numpy_scalars_and_rows():
    def f(x):
        return [r.sum() for r in x.numpy()], [v for v in x.numpy()[0]]

    fast = tempa.compile(f, fullgraph=True, backend="eager")
    x = torch.randn(2, 3)
    _same(f(x), fast(x))
    assert _counts() == (1, 0, 0, 0)


def test_tolist_gives_captured_python_numbers():
    def f(a, x):
        return (a * 2).tolist(), x.tolist(), x[0].tolist()

    fast = tempa.compile(f, fullgraph=True, backend="eager")
    for k in range(2):
        a, x = np.arange(3.0) + k, torch.arange(4).reshape(2, 2) * k
        _same(f(a, x), fast(a, x))
    assert _counts() == (1, 0, 0, 0)


@pytest.mark.parametrize("name", ["random", "tolist", "tensor_plus_array", "branch"])
def test_what_torch_cannot_trace_is_one_clean_break(name):
    def random(x):
        return x + torch.from_numpy(np.random.rand(3)).float() * 0

    def tolist(a):   # more elements than tolist() captures
        return (a * 2).tolist()

    def tensor_plus_array(x):
        return torch.ones(3) + x.numpy()

    def branch(a):
        if (a > 0).all():
            return a + 1
        return a - 1

    fn, arg = {"random": (random, torch.ones(3)), "tolist": (tolist, np.arange(100.0)),
               "tensor_plus_array": (tensor_plus_array, torch.ones(3)),
               "branch": (branch, np.arange(3.0))}[name]
    fast = tempa.compile(fn, backend="eager")
    _same(fn(arg), fast(arg))
    assert tempa.stats().graph_breaks == 1 and tempa.stats().eager_fallbacks == 0
    with pytest.raises(tempa.GraphBreakError):
        tempa.reset()
        tempa.compile(fn, fullgraph=True, backend="eager")(arg)


def test_numpy_of_a_tensor_that_requires_grad_raises_eagers_error():
    fast = tempa.compile(lambda x: x.numpy(), backend="eager")
    with pytest.raises(RuntimeError, match="requires grad"):
        fast(torch.ones(2, requires_grad=True))
    assert _counts() == (1, 1, 0, 0)


def test_in_place_numpy_functions_and_methods_are_kept():
    # np.ones is Python code around np.empty + np.copyto: traced as np.ones, and a
    # write that returns None (copyto, fill) stays in the graph
    def f(x):
        a = np.zeros(3)
        np.copyto(a, x.numpy())
        b = np.ones(3)
        b.fill(2.0)
        return a, b, x + torch.from_numpy(np.ones(3, dtype=np.float32))

    fast = tempa.compile(f, fullgraph=True)
    x = torch.arange(3.0)
    _same(f(x), fast(x))
    assert _counts() == (1, 0, 0, 0)


def test_a_module_attribute_array_is_a_graph_input_read_live():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = np.array([1.0, 2.0, 3.0], dtype=np.float32)

        def forward(self, x):
            return x * torch.from_numpy(self.table) + np.tanh(x.numpy()).sum()

    m = M()
    fast = tempa.compile(m, fullgraph=True)
    x = torch.ones(3)
    torch.testing.assert_close(fast(x), m(x))
    m.table[1] = 10.0
    torch.testing.assert_close(fast(x), m(x))
    assert _counts() == (1, 0, 0, 0)


def test_numbers_from_arrays_are_captured_values():
    def f(x):
        a = x.numpy()
        s = a.sum()
        return x * s.item() + float(a[0]), type(s.item()), type(float(s))

    fast = tempa.compile(f, fullgraph=True, backend="eager")
    for _ in range(2):
        x = torch.randn(3)
        _same(f(x), fast(x))
    assert _counts() == (1, 0, 0, 0)


def test_one_array_returned_twice_is_one_object():
    def f(x):
        a = x.numpy() * 2
        return a, [a], a.sum

    fast = tempa.compile(f, fullgraph=True, backend="eager")
    a, (b,), s = fast(torch.ones(3))
    assert a is b and s.__self__ is a and s() == 6.0
    assert _counts() == (1, 0, 0, 0)


def test_a_write_into_a_read_only_array_raises_numpys_error():
    def f(a):
        a += 1
        return a

    fast = tempa.compile(f, backend="eager")
    a = np.ones(3)
    a.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        fast(a)
    np.testing.assert_array_equal(a, np.ones(3))
    b = np.ones(3)
    assert fast(b) is b and (b == 2).all()   # a writeable one: a graph of its own
    assert _counts() == (2, 1, 1, 0)


def test_writes_through_tensor_numpy_reach_the_tensor():
    def f(x):
        a = x.numpy()
        a[0] = 5.0
        a += 1
        return x

    fast = tempa.compile(f, fullgraph=True)
    x = torch.zeros(3)
    assert fast(x) is x
    torch.testing.assert_close(x, torch.tensor([6.0, 1.0, 1.0]))
    assert _counts() == (1, 0, 0, 0)

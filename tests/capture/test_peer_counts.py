"""What a capture hands its backend, counted as torch.compile counts it (the peer suite's
CompileCounter tests): how many graphs, and which inputs and text they have. Each test
compares the compiled result with eager and checks tempa.stats() and the backend's calls;
the expected counts are torch.compile's on the same code."""
import functools

import torch

import tempa


class Counter:
    """A backend that records the graphs it is handed (torch's CompileCounter)."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def setup_function():
    tempa.reset()


def teardown_function():
    tempa.reset()


# -- metadata queries ---------------------------------------------------------------------

def test_channels_last_query_is_answered_at_capture_and_each_layout_compiles():
    def f(x):
        if x.is_contiguous():
            return x + 1
        if x.is_contiguous(memory_format=torch.channels_last):
            return x + 2
        return x + 3

    inputs = [torch.rand(2, 3, 4, 4),
              torch.rand(2, 3, 4, 4).contiguous(memory_format=torch.channels_last),
              torch.rand(2, 3, 4, 4)[:, :, 1:, :]]
    counter = Counter()
    fast = tempa.compile(f, backend=counter, fullgraph=True)
    for i, x in enumerate(inputs):
        assert torch.equal(fast(x), f(x))
        assert len(counter.graphs) == i + 1   # a layout change recompiles (torch.compile: 1, 2, 3)
    for x in inputs:   # and each layout finds its own entry again
        assert torch.equal(fast(x), f(x))
    s = tempa.stats()
    assert (s.captures, s.recompiles, s.graph_breaks, s.eager_fallbacks) == (3, 2, 0, 0)


def test_channels_last_query_of_a_computed_tensor():
    def f(x):
        y = x.permute(0, 2, 3, 1)
        return y.is_contiguous(memory_format=torch.channels_last), y.sum()

    x = torch.rand(2, 3, 4, 5)
    fast = tempa.compile(f, backend="eager", fullgraph=True)
    (flag, total), (eager_flag, eager_total) = fast(x), f(x)
    assert flag == eager_flag and torch.equal(total, eager_total)
    s = tempa.stats()
    assert (s.captures, s.graph_breaks, s.eager_fallbacks) == (1, 0, 0)


# -- graphs without operations ------------------------------------------------------------

def test_fullgraph_function_returning_an_input_tensor_is_handed_to_the_backend():
    def f(x):
        return functools.reduce(lambda a, b: (a, b), [x])   # one item: x itself

    counter = Counter()
    fast = tempa.compile(f, backend=counter, fullgraph=True)
    for x in (torch.randn(3), torch.randn(3)):
        assert fast(x) is x
    assert len(counter.graphs) == 1   # torch.compile calls its backend once here too
    assert tempa.stats().captures == 1


def test_function_without_operations_gets_no_graph_when_not_fullgraph():
    def f(x):
        return x

    counter = Counter()
    fast = tempa.compile(f, backend=counter)
    x = torch.randn(3)
    assert fast(x) is x
    assert counter.graphs == []   # torch.compile skips such a frame
    assert tempa.stats().captures == 1   # captured (no eager fallback), no graph to run


def test_fullgraph_function_returning_no_tensor_gets_no_graph():
    def f(x):
        return (x, [x])   # rebuilt from the input: nothing for a graph to compute

    counter = Counter()
    fast = tempa.compile(f, backend=counter, fullgraph=True)
    x = torch.randn(3)
    r = fast(x)
    assert r[0] is x and r[1][0] is x
    assert counter.graphs == []
    assert tempa.stats().captures == 1


# -- the graph's inputs and readable code -------------------------------------------------

def test_graph_inputs_are_the_tensors_read_named_by_their_source():
    def f(x, y):
        if x.sum() > 0:   # the graph before the break reads x only
            return x + y
        return x * y

    counter = Counter()
    fast = tempa.compile(f, backend=counter)
    a, b = torch.zeros(3), torch.ones(3)
    assert torch.equal(fast(a, b), f(a, b))
    first = counter.graphs[0]
    placeholders = [n for n in first.graph.nodes if n.op == "placeholder"]
    # torch.compile's names: the source L['x'] as L_x_ (FX names the node l_x_)
    assert [(n.target, n.name) for n in placeholders] == [("L_x_", "l_x_")]
    code = first.print_readable(print_output=False)
    assert 'def forward(self, L_x_: "f32[3]"):' in code
    assert 'sum_1: "f32[]" = l_x_.sum()' in code
    s = tempa.stats()
    assert (s.captures, s.graph_breaks, s.eager_fallbacks) == (2, 1, 0)


def test_graph_nodes_carry_the_user_stack_where_they_were_recorded():
    def scale(t):
        return t * 2

    def f(x):
        y = scale(x)
        return y + 1

    counter = Counter()
    fast = tempa.compile(f, backend=counter, fullgraph=True)
    x = torch.randn(4)
    assert torch.equal(fast(x), f(x))
    ops = {n.name: n for n in counter.graphs[0].graph.nodes if n.op == "call_function"}
    mul, add = ops["mul"].stack_trace, ops["add"].stack_trace
    # outermost frame first, as a traceback writes it; the innermost line last
    assert mul.index(", in f\n") < mul.index(", in scale\n")
    assert mul.rstrip().endswith("return t * 2")
    assert ", in scale" not in add and add.rstrip().endswith("return y + 1")


def test_an_input_no_operation_reads_leaves_the_graph_but_keeps_its_guard():
    def f(x, y):
        return x + 1, y.shape   # y's shape is baked into the result: its guard must stay

    counter = Counter()
    fast = tempa.compile(f, backend=counter, fullgraph=True, dynamic=False)
    x = torch.ones(3)
    for y in (torch.zeros(2), torch.zeros(5), torch.zeros(2)):
        r, e = fast(x, y), f(x, y)
        assert torch.equal(r[0], e[0]) and r[1] == e[1]
    assert len(counter.graphs) == 2 and all(
        [n.target for n in gm.graph.nodes if n.op == "placeholder"] == ["L_x_"]
        for gm in counter.graphs)
    s = tempa.stats()
    assert (s.captures, s.recompiles, s.graph_breaks) == (2, 1, 0)


# -- functions made on every call ---------------------------------------------------------

def _breaks():
    print("a graph break")


tempa.disable(_breaks)


def test_a_breaking_closure_made_per_call_runs_with_this_calls_cell():
    def outer(x, k):
        def g(y):
            _breaks()   # g breaks: the entry calls this call's g through tempa
            return y + k
        return g(x)

    fast = tempa.compile(outer, backend="eager")
    x = torch.zeros(2)
    for k in (1, 2, 3):
        assert torch.equal(fast(x, k), outer(x, k))   # was k == 1 on every call
    assert tempa.stats().graph_breaks >= 1 and tempa.stats().eager_fallbacks == 0


def test_a_breaking_function_made_per_call_binds_this_calls_defaults():
    def outer(x, k):
        def g(y, k=k):
            _breaks()
            return y + k
        return g(x)

    fast = tempa.compile(outer, backend="eager")
    x = torch.zeros(2)
    for k in (1, 2, 3):
        assert torch.equal(fast(x, k), outer(x, k))
    assert tempa.stats().graph_breaks >= 1 and tempa.stats().eager_fallbacks == 0


# -- closures over tensors across a graph break -------------------------------------------

def _adder(t):
    return lambda y: t + y


def test_a_closure_over_a_tensor_made_by_a_helper_is_carried_across_a_break():
    def f(x, z):
        g = _adder(x * 2)        # a closure over a tensor the graph computed
        _breaks()
        return g(z)              # the resume function reads it through g's cell

    fast = tempa.compile(f, backend="eager")
    for i in range(3):
        x, z = torch.full((2,), float(i)), torch.ones(2)
        assert torch.equal(fast(x, z), f(x, z))
    s = tempa.stats()
    # the graph before the break and the resume function's, each captured once: the new
    # closure of every call passes the guards on its code and cell
    assert (s.captures, s.recompiles, s.eager_fallbacks) == (2, 0, 0)


def test_a_closure_over_an_argument_is_carried_across_a_break_sharing_its_cell():
    def f(inp):
        def g(y):
            return inp + y
        _breaks()
        inp = inp * 10           # the closure sees the rebinding after the break
        return g(torch.ones(2))

    fast = tempa.compile(f, backend="eager")
    for i in range(3):
        x = torch.full((2,), float(i))
        assert torch.equal(fast(x), f(x))
    s = tempa.stats()
    assert s.eager_fallbacks == 0 and s.captures == 1   # the frame's graph; its resume runs as Python

"""The standard library and Python constructs inside captured code (capture/stdlib.py, the
match opcodes, @contextmanager): each compiled call equals eager, and the code is captured
whole (one capture, no graph break, no eager fallback).

torch.compile (torch 2.13, fullgraph=True, a CompileCounter backend), run side by side on
the same functions when these tests were written: one frame, no break, for each of
CAPTURED_WHOLE; it refuses two of BEYOND_TORCH_COMPILE ("Unsupported method call" for
deque.rotate, "Reconstruct user defined class without a source" for the returned
defaultdict.fromkeys) and makes no graph for the structseq one.
"""
import collections
import contextlib
import dataclasses
import enum
import functools
import itertools
import operator

import pytest
import torch

import tempa
from tests.capture.paths import counts


@pytest.fixture(autouse=True)
def _reset():
    tempa.reset()
    yield
    tempa.reset()


def _assert_same(r, expected):
    """Equal values, of the same types all the way down (deques, structseqs, dicts)."""
    assert type(r) is type(expected)
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(r, expected)
    elif isinstance(expected, (list, tuple, collections.deque)):
        assert len(r) == len(expected)
        for a, b in zip(r, expected):
            _assert_same(a, b)
    elif isinstance(expected, dict):
        assert list(r) == list(expected)
        for k in expected:
            _assert_same(r[k], expected[k])
    else:
        assert r == expected


def _captured_whole(fn, *args, calls=2):
    fast = tempa.compile(fn, fullgraph=True, backend="eager")
    results = [fast(*args) for _ in range(calls)]
    expected = fn(*args)
    for r in results:
        _assert_same(r, expected)
    s = tempa.stats()
    assert (s.captures, s.graph_breaks, s.eager_fallbacks) == (1, 0, 0), s
    return results[-1]


# -- functions torch.compile captures whole; tempa must too ----------------------------------

def chain(x, y):
    return sum(itertools.chain([x, y], (x * 2,)))


def chain_from_iterable(x, y):
    return list(itertools.chain.from_iterable([[x], (y, x + y)]))


def product_and_permutations(x, y):
    return [a * b for a, b in itertools.product([x, y], [1, 2])] + \
        [a @ b for a, b in itertools.permutations([x, y])]


def combinations_and_pairwise(x, y):
    return [a + b for a, b in itertools.combinations([x, y, x], 2)] + \
        [a - b for a, b in itertools.pairwise([x, y, x])]


def accumulate(x, y):
    return list(itertools.accumulate([x, y, x])) + list(itertools.accumulate([x, y], torch.mul))


def zip_longest_and_islice(x, y):
    pairs = [a if b is None else a + b for a, b in itertools.zip_longest([x, y], [x])]
    return pairs + list(itertools.islice(itertools.chain([y], itertools.repeat(x)), 3))


def cycle_and_repeat(x, y):
    c = itertools.cycle([x, y])
    return next(c) + next(c) + next(c) + sum(itertools.repeat(y, 2))


def compress_and_takewhile(x, y):
    kept = list(itertools.compress([x, y, x + y], [1, 0, 1]))
    return kept + list(itertools.takewhile(lambda t: t.dim() == 1, [x, y]))


def starmap_and_filterfalse(x, y):
    return list(itertools.starmap(torch.add, [(x, y), (y, y)])) + \
        list(itertools.filterfalse(lambda t: t.shape[0] > 3, [x, y]))


def reduce_(x, y):
    return functools.reduce(operator.add, [x, y, x]), functools.reduce(lambda a, b: a * b, [x, y], 2)


def operator_functions(x, y):
    return operator.mul(x, y) + operator.neg(x) + operator.pos(y) - operator.truediv(x, 2), \
        operator.lt(x, y), operator.getitem(x, 0), operator.is_(x, x), operator.abs(y)


def operator_getters(x, y):
    first = operator.itemgetter(1)([x, y])
    both = operator.itemgetter(0, 1)((x, y))
    shaped = x.reshape(operator.attrgetter("shape")(y))
    summed = operator.methodcaller("add", y, alpha=2)(x)
    return first + 1, both, shaped, summed


def deque_(x, y):
    d = collections.deque([x, y], maxlen=3)
    d.append(x * 3)
    d.appendleft(y)
    d.extend([x + 1])
    e = d.copy()
    e.rotate(1)
    return d.popleft() + e[0], d


def defaultdict_and_counter(x, y):
    d = collections.defaultdict(list)
    d["a"].append(x)
    d["a"].append(y)
    c = collections.Counter("abca")
    return d["a"][1] * c["a"], d


def ordered_dict_and_fromkeys(x, y):
    d = collections.OrderedDict(a=x, b=y)
    d.move_to_end("a")
    return list(d.values())[0], dict.fromkeys(["k", "l"], x), \
        collections.defaultdict.fromkeys(iter(["m"]), y), \
        collections.OrderedDict.fromkeys(("o",), value=x)


def generator_consumed_inside(x, y):
    def scaled():
        for i in range(3):
            yield x * i
    return sum(scaled()), list(map(lambda t: t + 1, filter(lambda t: t is not y, [x, y])))


def locals_and_vars(x, y):
    z = x + 1
    names = locals()
    return names["z"] * 2, sorted(vars()), len(names)


def list_of_tensors_repeated(x, y):
    tmp = [x + 1, y + 2]
    doubled = tmp[slice(1, 2)] * 2
    doubled *= 2
    return sum(4 * [x]), doubled, (x,) * 2


def builtins_over_values(x, y):
    n = max([x.shape[0], 2]) + min(3, 4)
    first = sorted([x, y[:2]], key=lambda t: t.shape[0])[0]
    ok = any([False, True]) and all([1, 2]) and isinstance(x, (int, torch.Tensor))
    return first * n if ok else y


def match_sequence(x, y):
    point = (x.shape[0], 0)
    match point:
        case (0, 0):
            return x
        case (n, 0):
            return x + n
        case _:
            return y


def match_mapping(x, y):
    match {"a": x, "b": y, "c": 3}:
        case {"z": _}:
            return x
        case {"a": a, **rest}:
            return a + rest["b"] * rest["c"]


@dataclasses.dataclass
class Point:
    a: torch.Tensor
    b: int = 2


def match_class_and_dataclass(x, y):
    p = Point(x)
    match p:
        case Point(a, b=3):
            return a
        case Point(a, b=b):
            match a:
                case torch.Tensor(shape=(4,)):
                    return a * b
    return y


class Color(enum.Enum):
    RED = 1
    GREEN = 2


def enum_(x, y):
    return x * Color.GREEN.value if Color(1) is Color.RED else y


def wraps_and_partial(x, y):
    def deco(f):
        @functools.wraps(f)
        def wrapper(*a):
            return f(*a) + 1
        return wrapper

    @deco
    def inner(a):
        return a * 2
    return inner(x), functools.partial(torch.add, alpha=2)(x, y), inner.__name__


def structseq(x, y):
    return torch.return_types.max((x, y))


@contextlib.contextmanager
def _logging(log, value):
    log.append("enter")
    try:
        yield value
    except ValueError as e:
        log.append(f"caught {e}")
    finally:
        log.append("exit")


def contextmanager_order(x, y):
    log = []
    with _logging(log, 3) as n:
        log.append("body")
        z = x * n
    return z + len(log), log


def contextmanager_suppresses(x, y):
    log = []
    with _logging(log, 1):
        z = x + y
        raise ValueError("boom")
    return z, log


def contextmanager_reraises(x, y):
    log = []
    try:
        with _logging(log, 1):
            raise KeyError("k")
    except KeyError as e:
        log.append(f"outside {e}")
    return x * 2, log


def contextmanager_return_inside(x, y):
    log = []
    with _logging(log, 2) as n:
        return x * n, log


class _Stateless(torch.nn.Module):
    def forward(self, x, y):
        out = torch.nn.ReLU()(torch.cat((x, y)))
        return torch.nn.Softmax(dim=-1)(out)


def modules_built_in_forward(x, y):
    return functools.partial(lambda mod, a, b: mod(a, b), _Stateless())(x, y), \
        torch.nn.Softmax(dim=0)(x + y * 2)


def distributions(x, y):
    normal = torch.distributions.Normal(x, y.abs() + 1, validate_args=False)
    categorical = torch.distributions.Categorical(logits=y, validate_args=False)
    return normal.log_prob(x * 2), categorical.probs * 2   # probs: a lazy_property, traced


CAPTURED_WHOLE = [
    chain, chain_from_iterable, product_and_permutations, combinations_and_pairwise, accumulate,
    zip_longest_and_islice, cycle_and_repeat, compress_and_takewhile, starmap_and_filterfalse,
    reduce_, operator_functions, operator_getters, defaultdict_and_counter,
    generator_consumed_inside, locals_and_vars, builtins_over_values, match_sequence,
    match_mapping, match_class_and_dataclass, enum_, wraps_and_partial, contextmanager_order,
    contextmanager_suppresses, contextmanager_reraises, contextmanager_return_inside,
    modules_built_in_forward, list_of_tensors_repeated, distributions,
]
BEYOND_TORCH_COMPILE = [deque_, ordered_dict_and_fromkeys, structseq]


@pytest.mark.parametrize("fn", CAPTURED_WHOLE + BEYOND_TORCH_COMPILE, ids=lambda f: f.__name__)
def test_captured_whole_and_equal_to_eager(fn):
    _captured_whole(fn, torch.randn(4), torch.randn(4))


# -- details of eager semantics ------------------------------------------------------------

def test_lazy_tools_run_their_function_when_the_item_is_consumed():
    def f(x):
        log = []
        acc = itertools.accumulate([x, x], lambda a, b: log.append(len(log)) or a + b)
        before = len(log)
        items = list(acc)
        return before, len(log), items

    before, after, _ = _captured_whole(f, torch.ones(2))
    assert (before, after) == (0, 1)


def test_itertools_count_and_repeat_returned_resume_where_eager_leaves_them():
    def f(a):
        ones, counter = itertools.repeat(1), itertools.count(2)
        for _ in range(3):
            a = a + next(ones) + next(counter)
        return ones, counter, a

    fast = tempa.compile(f, fullgraph=True, backend="eager")
    ones, counter, a = fast(torch.ones(2))
    torch.testing.assert_close(a, f(torch.ones(2))[2])
    assert (next(ones), next(counter)) == (1, 5)
    _, counter2, _ = fast(torch.ones(2))
    assert counter2 is not counter and next(counter2) == 5   # a new one per call
    assert (tempa.stats().captures, tempa.stats().graph_breaks) == (1, 0)


@pytest.mark.passes_without_capture("eager's own error is the outcome expected of capture")
def test_reduce_of_an_empty_iterable_raises_eagers_error():
    def f(x):
        return functools.reduce(operator.add, [])

    with pytest.raises(TypeError, match="empty iterable"):
        tempa.compile(f, backend="eager")(torch.ones(2))


@pytest.mark.passes_without_capture("eager's own error is the outcome expected of capture")
def test_match_class_positional_patterns_check_match_args_as_eager():
    class NoArgs:
        pass

    def f(x):
        match NoArgs():
            case NoArgs(y):
                return y
        return x

    with pytest.raises(TypeError, match="accepts 0 positional sub-patterns"):
        tempa.compile(f, backend="eager")(torch.ones(2))


def test_match_keys_does_not_grow_a_defaultdict():
    def f(x):
        d = collections.defaultdict(int, a=1)
        match d:
            case {"b": _}:
                return x, len(d)
            case _:
                return x + 1, len(d)

    _, n = _captured_whole(f, torch.ones(2))
    assert n == 1


@pytest.mark.passes_without_capture("eager's own error is the outcome expected of capture")
def test_contextmanager_that_does_not_yield_or_yields_twice_raises_eagers_error():
    @contextlib.contextmanager
    def no_yield():
        if False:
            yield

    @contextlib.contextmanager
    def twice():
        yield
        yield

    def f(x, cm):
        with cm():
            pass
        return x

    for cm, message in ((no_yield, "didn't yield"), (twice, "didn't stop")):
        tempa.reset()
        with pytest.raises(RuntimeError, match=message):
            tempa.compile(f, backend="eager")(torch.ones(2), cm)


def test_graph_break_inside_a_contextmanager_block_runs_eagerly_and_says_why():
    log = []

    @contextlib.contextmanager
    def cm():
        log.append("enter")
        yield
        log.append("exit")

    def f(x):
        with cm():
            print("inside")
            y = x + 1
        return y

    fast = tempa.compile(f, backend="eager")
    out = fast(torch.ones(2))
    torch.testing.assert_close(out, torch.ones(2) + 1)
    assert log == ["enter", "exit"]            # the generator ran once, in eager
    assert any("@contextmanager" in r for r in tempa.eager_reasons(fast))
    assert tempa.stats().eager_fallbacks == 1


def test_a_caller_owned_deque_is_not_changed_at_capture():
    def f(x, d):
        d.appendleft(x)
        return x + 1

    d = collections.deque()
    fast = tempa.compile(f, backend="eager")
    for _ in range(2):
        fast(torch.ones(2), d)
    assert len(d) == 2                          # once per call, as eager
    # the caller's deque is read as itself, so its items are guarded (one more on the
    # second call: a recompile); the write breaks the graph on each capture
    assert counts() == (3, 2, 1, 0)


def test_grad_mode_context_as_a_decorator_of_a_function_defined_inside():
    def f(x):
        @torch.no_grad()
        def scaled(t):
            return (t + 1) * 2
        y = scaled(x)
        return y, y.requires_grad, scaled.__name__, (x * 2).requires_grad

    y, grad_inside, name, grad_after = _captured_whole(f, torch.randn(3, requires_grad=True))
    assert (grad_inside, name, grad_after) == (False, "scaled", True)


def test_a_module_with_parameters_built_in_forward_is_refused_by_name():
    def f(x):
        return torch.nn.Linear(2, 2)(x)      # new random weights on every eager call

    with pytest.raises(tempa.GraphBreakError, match="Parameter"):
        tempa.compile(f, fullgraph=True, backend="eager")(torch.ones(2))


def test_distribution_validating_its_arguments_breaks_at_the_check_and_equals_eager():
    def f(x):
        normal = torch.distributions.Normal(x, torch.tensor(1.0))   # validate_args: a check
        return torch.distributions.Independent(normal, 1).log_prob(x)   # of tensor values

    x = torch.randn(3)
    with pytest.raises(tempa.GraphBreakError, match="data-dependent"):
        tempa.compile(f, fullgraph=True, backend="eager")(x)
    tempa.reset()
    torch.testing.assert_close(tempa.compile(f, backend="eager")(x), f(x))


def test_a_lazy_tool_that_runs_python_code_is_not_drained_when_it_leaves_the_capture():
    def f(x):
        log = []
        acc = itertools.accumulate([x, x], lambda a, b: log.append("step") or a + b)
        chained = itertools.chain(map(lambda t: log.append("map") or t, [x]))
        return acc, chained, log

    x = torch.ones(2)
    with pytest.raises(tempa.GraphBreakError, match="itertools.accumulate"):
        tempa.compile(f, fullgraph=True, backend="eager")(x)
    tempa.reset()
    acc, chained, log = tempa.compile(f, backend="eager")(x)
    assert log == [] and type(acc) is itertools.accumulate    # eager ran it, untouched
    assert len(list(acc)) == 2 and log == ["step"]


def test_a_generator_and_its_consumer_interleave_as_in_eager():
    def f(x):
        items = [x]

        def doubling():
            for _ in range(3):
                yield items[-1] * 2          # sees what the consumer appended
        for v in doubling():
            items.append(v)
        return items

    out = _captured_whole(f, torch.ones(2))
    torch.testing.assert_close(out[-1], torch.full((2,), 8.0))


def test_a_generator_left_suspended_at_the_end_is_refused_not_drained():
    def f(x):
        log = []

        def numbers():
            for i in range(3):
                log.append(i)
                yield x * i
        g = numbers()
        first = next(g)
        return first, g, log

    with pytest.raises(tempa.GraphBreakError, match="a generator .* suspended"):
        tempa.compile(f, fullgraph=True, backend="eager")(torch.ones(2))
    tempa.reset()
    first, g, log = tempa.compile(f, backend="eager")(torch.ones(2))
    assert log == [0]                          # eager's: one item taken, the rest pending
    assert len(list(g)) == 2 and log == [0, 1, 2]


def test_a_returned_compress_over_values_is_rebuilt_with_its_items():
    def f(x):
        return itertools.compress([x, x + 1, x + 2], [1, 0, 1]), itertools.compress("ABC", [0, 1, 1])

    picked, letters = tempa.compile(f, fullgraph=True, backend="eager")(torch.zeros(1))
    torch.testing.assert_close(list(picked), [torch.zeros(1), torch.full((1,), 2.0)])
    assert list(letters) == ["B", "C"]
    assert counts() == (1, 0, 0, 0)

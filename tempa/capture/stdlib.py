"""Models of the standard library's C code, so captured code can use it on tensors.

``itertools``, ``functools.reduce``, ``operator`` and the C containers of ``collections``
are C code: capture cannot inline them, and running them on captured values would let C
code iterate, compare or add TensorVars behind the interpreter's back. Each model here
does what the C code does with the interpreter's own services instead:

- iterables are opened with ``frame.get_iter`` (a user ``__iter__`` is traced, an
  iterator from outside the call is refused, a tensor is unbound as eager iterates it);
- functions handed to a tool (``accumulate``'s, ``reduce``'s, ``starmap``'s) and the
  operators of ``operator`` run through ``frame.call`` / ``frame.binary_op`` /
  ``frame.compare``, so tensor arithmetic becomes graph nodes;
- the real C object then only moves items around: an ``itertools.chain`` made over
  captured iterators is as lazy as eager's, and an object of this capture (it can be
  returned or live across a graph break through ``output.py``'s rebuilding).

``@contextlib.contextmanager`` lives here too: its generator runs step by step
(``generator_run.GeneratorRun``), its code before ``yield`` at ``__enter__``, after it at
``__exit__``, an exception of the body thrown in at the ``yield``, as contextlib does.

``torch.no_grad()(fn)`` (a grad-mode context as a decorator) is a wrapper the interpreter
inlines, entering a copy of the context around each call, as torch's decorator does.

Handlers take ``(tracer, frame, args, kwargs)`` (``MODELS``, keyed by the callable) or
``(tracer, frame, obj, args, kwargs)`` for instances (``INSTANCE_MODELS``, keyed by type).
"""
from __future__ import annotations

import collections
import contextlib
import copy
import functools
import itertools
import operator
import types
import warnings

from .breaks import InternalError, Unsupported, UserError
from .context import CapturedContext
from .values import GeneratorContext, GeneratorContextExit, LazyIter, TensorVar, \
    contains_tensor, has_pending_calls

_CO_GENERATOR = 0x20


def _bad_call(what: str):
    return UserError(TypeError(what))


# -- itertools ---------------------------------------------------------------------------

def _over_iterators(kind, n_iterables=None):
    """A tool whose first ``n_iterables`` positional arguments (all, if None) are iterables
    and whose other arguments are plain values (``islice``'s bounds, ``repeat``'s times)."""
    def handler(tracer, frame, args, kwargs):
        n = len(args) if n_iterables is None else min(n_iterables, len(args))
        its = [frame.get_iter(a) for a in args[:n]]
        return _made(tracer, kind, *its, *args[n:], calls=_has_pending_calls(its), **kwargs)
    return handler


def _made(tracer, kind, *args, calls: bool = False, **kwargs):
    """``kind(*args, **kwargs)``, an object of this capture. With ``calls`` (taking its items
    runs the program's Python code: a function given to it, a ``map`` below it) it is
    wrapped as a ``LazyIter``: its items cannot be taken early when it leaves the capture
    (``output.py`` refuses it there), as that would run the code at the wrong time."""
    try:
        made = kind(*args, **kwargs)
    except (TypeError, ValueError) as e:   # a bad call: the user's error, as eager raises it
        raise UserError(e) from None
    if calls:
        made = LazyIter(type(made), None, [a for a in args if hasattr(a, "__next__")], kwargs, made)
    return tracer.mark_internal(made)


def _has_pending_calls(iterators) -> bool:
    return any(has_pending_calls(it) for it in iterators)


def _chain_from_iterable(tracer, frame, args, kwargs):
    if len(args) != 1 or kwargs:
        raise _bad_call("chain.from_iterable() takes exactly one argument")
    outer = frame.get_iter(args[0])
    # chain opens each inner iterable only when it reaches it, as eager does
    return _made(tracer, itertools.chain.from_iterable, (frame.get_iter(v) for v in outer),
                 calls=True)   # opening an inner iterable may run its __iter__


def _accumulate(tracer, frame, args, kwargs):
    if not args:
        raise _bad_call("accumulate() missing required argument 'iterable'")
    it = frame.get_iter(args[0])
    func = args[1] if len(args) > 1 else kwargs.pop("func", None)
    if func is None:
        step = lambda a, b: frame.binary_op("NB_ADD", a, b)   # noqa: E731
    else:
        step = lambda a, b: frame.call(func, [a, b], {})     # noqa: E731
    return _made(tracer, itertools.accumulate, it, step, *args[2:],
                 calls=func is not None or _has_pending_calls([it]), **kwargs)


def _calling(kind, *, star: bool = False):
    """``starmap(fn, it)``, ``takewhile(pred, it)``, ``dropwhile``, ``filterfalse``: the
    function runs traced, one item at a time, when the tool asks for it."""
    def handler(tracer, frame, args, kwargs):
        if len(args) != 2 or kwargs:
            raise _bad_call(f"{kind.__name__}() takes exactly two arguments")
        fn, it = args[0], frame.get_iter(args[1])
        calls = True
        if star:
            step = lambda *items: frame.call(fn, list(items), {})   # noqa: E731
        elif fn is None and kind is itertools.filterfalse:   # the items' own truth
            step, calls = frame.truth, _has_pending_calls([it])
        else:
            step = lambda v: frame.truth(frame.call(fn, [v], {}))   # noqa: E731
        return _made(tracer, kind, step, it, calls=calls)
    return handler


def _compress(tracer, frame, args, kwargs):
    if len(args) != 2 or kwargs:
        raise _bad_call("compress() takes exactly two arguments")
    data, selectors = frame.get_iter(args[0]), frame.get_iter(args[1])
    # (truth of a selector runs no traced code: pending only if a source is)
    return _made(tracer, itertools.compress, data, (frame.truth(s) for s in selectors),
                 calls=_has_pending_calls([data, selectors]))


_ITERTOOLS = {
    itertools.chain: _over_iterators(itertools.chain),
    itertools.chain.from_iterable: _chain_from_iterable,
    itertools.product: _over_iterators(itertools.product),
    itertools.permutations: _over_iterators(itertools.permutations, 1),
    itertools.combinations: _over_iterators(itertools.combinations, 1),
    itertools.combinations_with_replacement: _over_iterators(
        itertools.combinations_with_replacement, 1),
    itertools.islice: _over_iterators(itertools.islice, 1),
    itertools.pairwise: _over_iterators(itertools.pairwise),
    itertools.zip_longest: _over_iterators(itertools.zip_longest),
    itertools.cycle: _over_iterators(itertools.cycle),
    itertools.repeat: _over_iterators(itertools.repeat, 0),
    itertools.accumulate: _accumulate,
    itertools.starmap: _calling(itertools.starmap, star=True),
    itertools.takewhile: _calling(itertools.takewhile),
    itertools.dropwhile: _calling(itertools.dropwhile),
    itertools.filterfalse: _calling(itertools.filterfalse),
    itertools.compress: _compress,
}


# -- functools ---------------------------------------------------------------------------

def _reduce(tracer, frame, args, kwargs):
    if kwargs or not 2 <= len(args) <= 3:
        raise _bad_call(f"reduce expected at least 2 arguments, got {len(args)}")
    fn, it = args[0], frame.get_iter(args[1])
    if len(args) == 3:
        acc = args[2]
    else:
        try:
            acc = next(it)
        except StopIteration:
            raise _bad_call("reduce() of empty iterable with no initial value") from None
    for item in it:
        acc = frame.call(fn, [acc, item], {})
    return acc


# -- operator ----------------------------------------------------------------------------

def _binary(opname: str):
    def handler(tracer, frame, args, kwargs):
        if len(args) != 2 or kwargs:
            raise _bad_call(f"expected 2 arguments, got {len(args)}")
        return frame.binary_op(opname, *args)
    return handler


def _comparison(symbol: str):
    def handler(tracer, frame, args, kwargs):
        if len(args) != 2 or kwargs:
            raise _bad_call(f"expected 2 arguments, got {len(args)}")
        return frame.compare(symbol, *args)
    return handler


def _unary(fn):
    def handler(tracer, frame, args, kwargs):
        if len(args) != 1 or kwargs:
            raise _bad_call(f"expected 1 argument, got {len(args)}")
        return frame.unary(fn, args[0])
    return handler


def _truth(negate: bool):
    def handler(tracer, frame, args, kwargs):
        if len(args) != 1 or kwargs:
            raise _bad_call(f"expected 1 argument, got {len(args)}")
        return frame.truth(args[0]) is not negate
    return handler


def _identity(negate: bool):
    def handler(tracer, frame, args, kwargs):   # as IS_OP: a tensor is its TensorVar
        if len(args) != 2 or kwargs:
            raise _bad_call(f"expected 2 arguments, got {len(args)}")
        return (args[0] is args[1]) is not negate
    return handler


def _getitem(tracer, frame, args, kwargs):
    if len(args) != 2 or kwargs:
        raise _bad_call(f"expected 2 arguments, got {len(args)}")
    return frame.subscr(*args)


_OPERATOR_BINARY = {"add": "ADD", "sub": "SUBTRACT", "mul": "MULTIPLY", "truediv": "TRUE_DIVIDE",
                    "floordiv": "FLOOR_DIVIDE", "mod": "REMAINDER", "pow": "POWER",
                    "matmul": "MATRIX_MULTIPLY", "lshift": "LSHIFT", "rshift": "RSHIFT",
                    "and_": "AND", "or_": "OR", "xor": "XOR"}
_OPERATOR = {getattr(operator, name): _binary(f"NB_{op}") for name, op in _OPERATOR_BINARY.items()}
_OPERATOR.update({getattr(operator, "i" + name.rstrip("_")): _binary(f"NB_INPLACE_{op}")
                  for name, op in _OPERATOR_BINARY.items()})
_OPERATOR.update({getattr(operator, name): _comparison(symbol) for name, symbol in
                  (("lt", "<"), ("le", "<="), ("eq", "=="), ("ne", "!="), ("gt", ">"),
                   ("ge", ">="))})
_OPERATOR.update({operator.neg: _unary(operator.neg), operator.pos: _unary(operator.pos),
                  operator.invert: _unary(operator.invert), operator.inv: _unary(operator.inv),
                  operator.abs: _unary(operator.abs), operator.truth: _truth(False),
                  operator.not_: _truth(True), operator.getitem: _getitem,
                  operator.is_: _identity(False), operator.is_not: _identity(True)})


def _itemgetter(tracer, frame, getter, args, kwargs):
    if len(args) != 1 or kwargs:
        raise _bad_call(f"itemgetter expected 1 argument, got {len(args)}")
    keys = getter.__reduce__()[1]
    items = tuple(frame.subscr(args[0], k) for k in keys)
    return items[0] if len(keys) == 1 else items


def _attrgetter(tracer, frame, getter, args, kwargs):
    if len(args) != 1 or kwargs:
        raise _bad_call(f"attrgetter expected 1 argument, got {len(args)}")
    paths = getter.__reduce__()[1]

    def follow(path):
        value = args[0]
        for name in path.split("."):
            value = tracer.load_attr(value, name, frame)
        return value
    values = tuple(follow(p) for p in paths)
    return values[0] if len(paths) == 1 else values


def _methodcaller(tracer, frame, caller, args, kwargs):
    if len(args) != 1 or kwargs:
        raise _bad_call(f"methodcaller expected 1 argument, got {len(args)}")
    maker, call_args = caller.__reduce__()
    # (methodcaller, (name, *args)), or (partial(methodcaller, name, **kw), args) with keywords
    if isinstance(maker, functools.partial):
        name, keywords = maker.args[0], maker.keywords
    else:
        (name, *call_args), keywords = call_args, {}
    method = tracer.load_attr(args[0], name, frame)
    return frame.call(method, list(call_args), dict(keywords))


# -- collections and dict ------------------------------------------------------------------

def _deque(tracer, frame, args, kwargs):
    """``deque(iterable, maxlen)``: the iterable opened by the interpreter; the deque then
    only stores its items, tensors included."""
    iterable = args[0] if args else kwargs.pop("iterable", ())
    items = list(frame.get_iter(iterable))
    return _made(tracer, collections.deque, items, *args[1:], **kwargs)


def _fromkeys(cls):
    def handler(tracer, frame, args, kwargs):
        if not args:
            raise _bad_call("fromkeys expected at least 1 argument, got 0")
        keys = list(frame.get_iter(args[0]))
        for k in keys:
            if isinstance(k, TensorVar):   # identity-keyed: left to eager (conservative)
                raise Unsupported("unsupported call", f"{cls.__name__}.fromkeys with tensor keys")
        return _made(tracer, cls.fromkeys, keys, *args[1:], **kwargs)
    return handler


# Methods of a deque that store or hand back items (tensors included) without looking at
# them; the ones that compare items (remove, index, count, `in`) are not here: a tensor's
# == is elementwise in eager.
DEQUE_STORING_METHODS = {"append", "appendleft", "extend", "extendleft", "pop", "popleft",
                         "rotate", "clear", "copy", "__getitem__", "__setitem__", "__delitem__",
                         "__len__", "insert", "reverse", "__init__"}


def structseq(tracer, frame, cls, args, kwargs):
    """``torch.return_types.max((values, indices))``: a C struct sequence that stores the
    items of its one iterable argument (a dict of extra fields is refused as eager's C code
    would need one it can read)."""
    if len(args) != 1 or kwargs:
        raise _bad_call(f"{cls.__name__}() takes one sequence argument in captured code")
    return _made(tracer, cls, list(frame.get_iter(args[0])))


# -- contextlib.contextmanager -------------------------------------------------------------

def _generator_context(tracer, frame, args, kwargs):
    """``_GeneratorContextManager(func, args, kwds)``, what ``@contextmanager``'s helper
    builds: the generator is made now (its arguments are bound, as eager binds them) and
    runs nothing until ``__enter__``."""
    from .calls_inline import start_generator
    func, fargs, fkwargs = args
    run = start_generator(tracer, frame, func, list(fargs), dict(fkwargs))
    return tracer.mark_internal(GeneratorContext(run))


def enter_generator_context(frame, ctx: GeneratorContext):
    """``__enter__``: run the generator to its first ``yield``; its value is ``as``'s."""
    if ctx.entered:
        raise UserError(RuntimeError("generator didn't yield")) from None
    ctx.entered = True
    try:
        value = ctx.run.send(None)
    except StopIteration:
        raise UserError(RuntimeError("generator didn't yield")) from None
    return frame.tracer.mark_internal(GeneratorContextExit(ctx)), value


def exit_generator_context(frame, exit_fn: GeneratorContextExit, typ, value, traceback):
    """``__exit__``, as ``contextlib._GeneratorContextManager.__exit__`` reads: resume the
    generator (no exception) or throw the body's exception in at the ``yield``; True
    suppresses the exception."""
    run = exit_fn.context.run
    if typ is None:
        try:
            run.send(None)
        except StopIteration:
            return False
        raise UserError(RuntimeError("generator didn't stop"))
    if value is None:
        value = typ()
    try:
        run.throw(value)
    except StopIteration as stop:
        return stop is not value
    except RuntimeError as exc:
        if exc is value or isinstance(value, StopIteration) and exc.__cause__ is value:
            return False
        raise UserError(exc) from None
    except (Unsupported, InternalError):   # capture's own exits, not the generator's
        raise
    except BaseException as exc:
        if exc is not value:
            raise UserError(exc) from None
        return False
    run.close()
    raise UserError(RuntimeError("generator didn't stop after throw()"))


# -- a grad-mode / autocast context as a decorator ---------------------------------------

def _context_as_decorator(tracer, frame, ctx, args, kwargs):
    """``torch.no_grad()(fn)`` (``@torch.no_grad()`` on a function defined in captured
    code): as torch's ``_DecoratorContextManager``, a wrapper that runs ``fn`` inside a copy
    of the context on each call. The wrapper is Python code the interpreter inlines."""
    from .context import _AlreadyEntered
    if len(args) != 1 or kwargs or not isinstance(args[0], types.FunctionType) or \
            args[0].__code__.co_flags & _CO_GENERATOR or type(ctx) is _AlreadyEntered:
        raise Unsupported("unsupported call", "a grad-mode/autocast context called on "
                          "something other than a plain Python function")
    decorated = _context_decorated(ctx, args[0])
    for cell in decorated.__closure__:   # made here: no state of the caller's to guard
        tracer.mark_internal(cell)
    return tracer.mark_internal(decorated)


def _context_decorated(ctx, fn):
    @functools.wraps(fn)
    def decorated(*args, **kwargs):
        with copy.copy(ctx):
            return fn(*args, **kwargs)
    return decorated


def _catch_warnings(tracer, frame, args, kwargs):
    """``warnings.catch_warnings(...)`` only stores its arguments (the warnings module it
    will save and restore included): an object of this capture, rebuilt for each call
    where it leaves it. Entering it in the capture: ``context.catch_warnings_block``."""
    if contains_tensor(args) or contains_tensor(kwargs):
        raise Unsupported("unsupported call", "warnings.catch_warnings(tensor)")
    try:
        made = warnings.catch_warnings(*args, **kwargs)
    except Exception as e:   # a positional or unknown argument: eager's TypeError
        raise UserError(e) from None
    return tracer.mark_internal(made)


MODELS = {
    **_ITERTOOLS,
    warnings.catch_warnings: _catch_warnings,
    **_OPERATOR,
    functools.reduce: _reduce,
    collections.deque: _deque,
    dict.fromkeys: _fromkeys(dict),
    collections.OrderedDict.fromkeys: _fromkeys(collections.OrderedDict),
    collections.defaultdict.fromkeys: _fromkeys(collections.defaultdict),
    contextlib._GeneratorContextManager: _generator_context,
}

# C classes that only store their arguments (tensors included) for the models above.
STORING_CLASSES = (operator.itemgetter, operator.attrgetter, operator.methodcaller)

INSTANCE_MODELS = {
    CapturedContext: _context_as_decorator,
    operator.itemgetter: _itemgetter,
    operator.attrgetter: _attrgetter,
    operator.methodcaller: _methodcaller,
}

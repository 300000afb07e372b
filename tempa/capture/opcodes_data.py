"""Opcode handlers for data: stack shuffling, building containers, operators, subscripts
and string formatting. Mixed into ``interpreter.Frame``, whose services (``push``, ``pop``,
``truth``, ``get_iter``, ``call``, ``binary_op``) they use."""
from __future__ import annotations

import collections
import operator
import types

import torch

from . import operators
from .breaks import Unsupported
from . import numpy_values, scalars, shapes
from .side_effects import defaultdict_missing
from .values import NULL, NdarrayVar, TensorVar, contains_tensor as contains_symbolic

# Type flags MATCH_MAPPING / MATCH_SEQUENCE / MATCH_CLASS read (Include/object.h).
_TPFLAGS_SEQUENCE, _TPFLAGS_MAPPING, _TPFLAGS_MATCH_SELF = 1 << 5, 1 << 6, 1 << 22

_COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
            ">": operator.gt, ">=": operator.ge}


class DataOpcodes:
    # -- stack shuffling ---------------------------------------------------------------------
    def POP_TOP(self, ins):
        self.pop()

    def PUSH_NULL(self, ins):
        self.push(NULL)

    def COPY(self, ins):
        self.push(self.stack[-ins.arg])

    def SWAP(self, ins):
        s = self.stack
        s[-1], s[-ins.arg] = s[-ins.arg], s[-1]

    def KW_NAMES(self, ins):
        self.kw_names = ins.argval

    # -- building containers -----------------------------------------------------------------
    def BUILD_TUPLE(self, ins):
        self.push(tuple(self.popn(ins.arg)))

    def BUILD_LIST(self, ins):
        self.push(self.popn(ins.arg))

    def BUILD_SET(self, ins):
        items = self.popn(ins.arg)
        self.tracer.identity_used(*items)   # hashed (by identity, for plain objects)
        self.push(set(items))

    def BUILD_MAP(self, ins):
        items = self.popn(2 * ins.arg)
        self.tracer.identity_used(*items[::2])
        self.push({items[i]: items[i + 1] for i in range(0, len(items), 2)})

    def BUILD_CONST_KEY_MAP(self, ins):
        keys = self.pop()
        values = self.popn(ins.arg)
        self.push(dict(zip(keys, values)))

    def BUILD_STRING(self, ins):
        self.push("".join(self.popn(ins.arg)))

    def BUILD_SLICE(self, ins):
        self.push(slice(*self.popn(ins.arg)))

    def LIST_APPEND(self, ins):
        v = self.pop()
        self.stack[-ins.arg].append(v)

    def SET_ADD(self, ins):
        v = self.pop()
        self.tracer.identity_used(v)
        self.stack[-ins.arg].add(v)

    def MAP_ADD(self, ins):
        value = self.pop()
        key = self.pop()
        self.tracer.identity_used(key)
        self.stack[-ins.arg][key] = value

    def LIST_EXTEND(self, ins):
        seq = self.pop()
        self.stack[-ins.arg].extend(self.get_iter(seq))

    def SET_UPDATE(self, ins):
        seq = self.pop()
        self.stack[-ins.arg].update(self.get_iter(seq))

    def DICT_UPDATE(self, ins):
        d = self.pop()
        self.stack[-ins.arg].update(self._as_mapping(d))

    def DICT_MERGE(self, ins):
        d = self.pop()
        target = self.stack[-ins.arg]
        for k, v in self._as_mapping(d).items():
            if k in target:
                raise TypeError(f"got multiple values for keyword argument '{k}'")
            target[k] = v

    def _as_mapping(self, d):
        if isinstance(d, dict):
            self.tracer.contents_read_by_c(d)   # {**out}, f(**out): an output record's items
            return d
        if hasattr(d, "keys"):
            return {k: self.subscr(d, k) for k in self.call(self.tracer.load_attr(d, "keys", self), [], {})}
        raise TypeError(f"'{type(d).__name__}' object is not a mapping")

    def LIST_TO_TUPLE(self, ins):  # 3.11
        self.push(tuple(self.pop()))

    def CALL_INTRINSIC_1(self, ins):  # 3.12+
        v = self.pop()
        if ins.arg == 6:      # INTRINSIC_LIST_TO_TUPLE
            self.push(tuple(v))
        elif ins.arg == 5:    # INTRINSIC_UNARY_POSITIVE
            self.push(self.unary(operator.pos, v))
        elif ins.arg == 3:    # INTRINSIC_STOPITERATION_ERROR: an exception leaving a generator
            if isinstance(v, StopIteration):   # PEP 479; any other one goes on unchanged
                error = RuntimeError("generator raised StopIteration")
                error.__cause__ = v
                v = error
            self.push(v)
        else:
            raise Unsupported("unsupported opcode", f"CALL_INTRINSIC_1 {ins.argval}")

    def UNPACK_SEQUENCE(self, ins):
        v = self.pop()
        items = list(self.get_iter(v)) if not isinstance(v, (list, tuple)) else list(v)
        if len(items) != ins.arg:
            raise ValueError(f"expected {ins.arg} values to unpack, got {len(items)}")
        for item in reversed(items):
            self.push(item)

    def UNPACK_EX(self, ins):
        v = self.pop()
        items = list(self.get_iter(v))
        before, after = ins.arg & 0xFF, ins.arg >> 8
        if len(items) < before + after:
            raise ValueError("not enough values to unpack")
        rest = items[before:len(items) - after]
        for item in reversed(items[len(items) - after:]):
            self.push(item)
        self.push(rest)
        for item in reversed(items[:before]):
            self.push(item)

    # -- operators ---------------------------------------------------------------------------
    def BINARY_OP(self, ins):
        b = self.pop()
        a = self.pop()
        self.push(self.binary_op(ins.argval, a, b))

    def COMPARE_OP(self, ins):
        b = self.pop()
        a = self.pop()
        self.push(self.compare(ins.argval, a, b))

    def compare(self, symbol: str, a, b):
        """``a <symbol> b`` (``<``, ``==``, ...): a graph node when a tensor, a captured scalar
        or a traced ndarray takes part."""
        fn = _COMPARE[symbol]
        if scalars.is_scalar(a) or scalars.is_scalar(b):
            return scalars.operator_call(self.tracer, fn, (a, b))
        if numpy_values.is_array(a) or numpy_values.is_array(b):
            return numpy_values.operator_call(self.tracer, fn, (a, b))
        if isinstance(a, TensorVar) or isinstance(b, TensorVar):
            return self.tracer.builder.call("call_function", fn, (a, b), {})
        result = operators.compare(self, symbol, a, b)
        if result is not operators.NATIVE:
            return result
        self.tracer.identity_used(a, b)   # object.__eq__ compares identity
        return fn(a, b)

    def IS_OP(self, ins):
        b = self.pop()
        a = self.pop()
        if isinstance(a, torch.SymInt) and isinstance(b, (int, torch.SymInt)) or \
                isinstance(b, torch.SymInt) and isinstance(a, int):
            # which int object a symbolic int is: its value decides (small ints are cached)
            a, b = shapes.specialized(a), shapes.specialized(b)
        if type(a) is type(b):   # (objects of different classes are never one: their guards say so)
            self.tracer.identity_used(a, b)
        self.push((a is not b) if ins.arg else (a is b))

    def CONTAINS_OP(self, ins):
        container = self.pop()
        item = self.pop()
        if isinstance(container, (TensorVar, NdarrayVar)) or \
                isinstance(item, (TensorVar, NdarrayVar)) and \
                not isinstance(container, (list, tuple, dict, set)):
            raise Unsupported("data-dependent value", "`in` on a tensor")
        if isinstance(item, TensorVar) and isinstance(container, (dict, set)):
            item = self.tracer.tensor_key(container, item)
        contains = getattr(type(container), "__contains__", None)
        if isinstance(container, torch.nn.Module):
            self.tracer.guard_module_contents(container)
            r = item in container
        elif isinstance(contains, types.FunctionType):
            # Python code (a user class, os.environ): interpreted, so its reads are guarded.
            r = self.truth(self.call(contains, [container, item], {}))
        else:
            # found by hash and ==: by identity, for plain objects
            self.tracer.identity_used(item, *(container if isinstance(
                container, (list, tuple, set, frozenset, dict)) else ()))
            r = item in container
        self.push((not r) if ins.arg else r)

    def unary(self, fn, v):
        if scalars.is_scalar(v):
            return scalars.operator_call(self.tracer, fn, (v,))
        if numpy_values.is_array(v):
            return numpy_values.operator_call(self.tracer, fn, (v,))
        if isinstance(v, TensorVar):
            return self.tracer.builder.call("call_function", fn, (v,), {})
        result = operators.unary(self, fn.__name__, v)
        return fn(v) if result is operators.NATIVE else result

    def UNARY_NEGATIVE(self, ins):
        self.push(self.unary(operator.neg, self.pop()))

    def UNARY_INVERT(self, ins):
        self.push(self.unary(operator.invert, self.pop()))

    def UNARY_POSITIVE(self, ins):
        self.push(self.unary(operator.pos, self.pop()))

    def UNARY_NOT(self, ins):
        self.push(not self.truth(self.pop()))

    def TO_BOOL(self, ins):  # 3.13
        self.push(self.truth(self.pop()))

    def BINARY_SUBSCR(self, ins):
        key = self.pop()
        container = self.pop()
        self.push(self.subscr(container, key))

    def subscr(self, container, key):
        tracer = self.tracer
        if isinstance(container, TensorVar):
            return tracer.builder.call("call_function", operator.getitem, (container, key), {})
        if numpy_values.is_array(container):
            return numpy_values.getitem(tracer, container, key)
        if isinstance(key, TensorVar) and isinstance(container, (dict, set, frozenset)):
            key = tracer.tensor_key(container, key)   # a dict keyed by tensors (an optimizer's state)
        elif isinstance(key, TensorVar) and isinstance(container, (list, tuple)):
            key = scalars.literal_index(key)   # items[torch.as_tensor(2)]
        elif contains_symbolic(key):
            raise Unsupported("data-dependent value", "indexing a Python container with a tensor")
        if isinstance(container, torch.nn.Module):
            tracer.guard_module_contents(container)
            item = container[key]
            if isinstance(item, torch.nn.Module):
                tracer.builder.modules[id(item)] = item
                if not isinstance(key, slice):
                    tracer.paths.setdefault(id(item), f"{tracer.path_of(container)}[{key!r}]")
                else:
                    tracer.mark_internal(item)
            elif isinstance(item, torch.Tensor):
                item = tracer.builder.attr_input(item, f"{tracer.path_of(container)}[{key!r}]")
            return item
        getitem = getattr(type(container), "__getitem__", None)
        if isinstance(getitem, types.FunctionType):
            return self.call(getitem, [container, key], {})
        if isinstance(container, type):  # typing generics: Tuple[int], list[str]
            return container[key]
        if isinstance(container, collections.defaultdict) and key not in container and \
                id(container) in tracer.external_copies:
            return defaultdict_missing(self, container, key)
        tracer.identity_used(key)   # a dict key: hashed
        return container[key]

    def STORE_SUBSCR(self, ins):
        key = self.pop()
        container = self.pop()
        value = self.pop()
        tracer = self.tracer
        tracer.identity_used(key)
        if isinstance(container, TensorVar):
            if numpy_values.holds_array(value):
                raise Unsupported("non-torch library call", "a numpy array assigned into a tensor")
            tracer.builder.call("call_function", operator.setitem, (container, key, value), {})
            return
        if numpy_values.is_array(container):
            numpy_values.setitem(tracer, container, key, value)
            return
        setitem = getattr(type(container), "__setitem__", None)
        if isinstance(setitem, types.FunctionType):   # (its list.__setitem__ marks a copy)
            self.call(setitem, [container, key, value], {})
        elif id(container) in tracer.external_copies:
            # our copy of the caller's list/dict: written back after the graph (side_effects.py)
            tracer.side_effects.mutated_copy(container)
            container[key] = value
        elif tracer.is_outside_container(container):
            raise Unsupported("mutation of outside state", f"item assignment on the caller's "
                              f"{type(container).__name__}")
        elif isinstance(container, (list, dict)) or tracer.is_internal(container):
            container[key] = value
        else:
            raise Unsupported("mutation of outside state",
                              f"item assignment on a {type(container).__name__}")

    def DELETE_SUBSCR(self, ins):
        key = self.pop()
        container = self.pop()
        if not isinstance(container, (list, dict)) or self.tracer.is_outside_container(container):
            raise Unsupported("mutation of outside state", "del container[key]")
        delitem = getattr(type(container), "__delitem__", None)
        if isinstance(delitem, types.FunctionType):   # (its list.__delitem__ marks a copy)
            self.call(delitem, [container, key], {})
            return
        self.tracer.identity_used(key)
        del container[key]   # raises as eager does before anything is marked
        if id(container) in self.tracer.external_copies:
            self.tracer.side_effects.mutated_copy(container)

    # -- structural pattern matching (``match``; the same opcodes in 3.11 to 3.13) ----------
    def GET_LEN(self, ins):
        self.push(self.call(len, [self.stack[-1]], {}))

    def MATCH_MAPPING(self, ins):
        self.push(bool(self._type_flags(self.stack[-1]) & _TPFLAGS_MAPPING))

    def MATCH_SEQUENCE(self, ins):
        self.push(bool(self._type_flags(self.stack[-1]) & _TPFLAGS_SEQUENCE))

    def _type_flags(self, v) -> int:
        kind = self.call(type, [v], {})   # a tensor's type is Tensor or Parameter
        return kind.__flags__

    def MATCH_KEYS(self, ins):
        # As CPython's match_keys: one ``subject.get(key, <missing>)`` per key, so a
        # defaultdict does not grow; duplicate keys are the pattern's error.
        keys, subject = self.stack[-1], self.stack[-2]
        if len(set(keys)) != len(keys):
            raise ValueError(f"mapping pattern checks duplicate key ({keys!r})")
        get = self.tracer.load_attr(subject, "get", self)
        missing = object()
        values = []
        for key in keys:
            v = self.call(get, [key, missing], {})
            if v is missing:
                self.push(None)
                return
            values.append(v)
        self.push(tuple(values))

    def MATCH_CLASS(self, ins):
        names = self.pop()
        cls = self.pop()
        subject = self.pop()
        self.push(self._match_class(subject, cls, ins.arg, names))

    def _match_class(self, subject, cls, npositional: int, names: tuple):
        """The attributes ``case cls(p0, p1, name=p)`` matches against, or None: as
        CPython's match_class (positional names from ``__match_args__``, the subject itself
        for ``int(x)``, ``str(x)``... whose class matches itself)."""
        if not isinstance(cls, type):
            raise TypeError("called match pattern must be a class")
        if not self.call(isinstance, [subject, cls], {}):
            return None
        wanted, match_self = [], False
        if npositional:
            try:
                match_args = self.tracer.load_attr(cls, "__match_args__", self)
            except AttributeError:
                match_args = None
            match_self = match_args is None and bool(cls.__flags__ & _TPFLAGS_MATCH_SELF)
            if match_args is not None and not isinstance(match_args, tuple):
                raise TypeError(f"{cls.__name__}.__match_args__ must be a tuple (got "
                                f"{type(match_args).__name__})")
            allowed = 1 if match_self else len(match_args or ())
            if allowed < npositional:
                plural = "" if allowed == 1 else "s"
                raise TypeError(f"{cls.__name__}() accepts {allowed} positional sub-pattern"
                                f"{plural} ({npositional} given)")
            if not match_self:
                for name in match_args[:npositional]:
                    if not isinstance(name, str):
                        raise TypeError("__match_args__ elements must be strings (got "
                                        f"{type(name).__name__})")
                    wanted.append(name)
        seen = set()
        for name in (*wanted, *names):
            if name in seen:
                raise TypeError(f"{cls.__name__}() got multiple sub-patterns for attribute {name!r}")
            seen.add(name)
        attrs = [subject] if match_self else []
        for name in (*wanted, *names):
            try:
                attrs.append(self.tracer.load_attr(subject, name, self))
            except AttributeError:
                return None
        return tuple(attrs)

    # -- formatting --------------------------------------------------------------------------
    def FORMAT_VALUE(self, ins):  # 3.11/3.12
        spec = self.pop() if (ins.arg & 0x04) else ""
        v = self.pop()
        conv = ins.arg & 0x03
        self.push(self._format(v, conv, spec))

    def CONVERT_VALUE(self, ins):  # 3.13
        v = self.pop()
        self.push(self._convert(v, ins.arg))

    def FORMAT_SIMPLE(self, ins):  # 3.13
        self.push(self._format(self.pop(), 0, ""))

    def FORMAT_WITH_SPEC(self, ins):  # 3.13
        spec = self.pop()
        self.push(self._format(self.pop(), 0, spec))

    def _convert(self, v, conv):
        if contains_symbolic(v):
            raise Unsupported("data-dependent value", "formatting a tensor into a string")
        self.tracer.identity_used(v)   # object.__repr__ shows the address
        return {0: lambda x: x, 1: str, 2: repr, 3: ascii}[conv](shapes.specialized(v))

    def _format(self, v, conv, spec):
        return format(self._convert(v, conv), shapes.specialized(spec))

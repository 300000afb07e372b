"""The wrong-answer clusters C1-C12 found by running PyTorch's own Dynamo tests against
tempa (/work/shared/bugs/peer_repros.py), as small cases of our own, named cNN_<what>."""
import torch
from torch import nn

from ._util import fn_case, module_case
from .cases_bugs import fresh_fn
from .harness import Case, Lazy, R, State, apply, call, mutate


# ---------------------------------------------------------------- C1: stale guards
def _global_set_state():
    fn, g = fresh_fn("def times_len(x):\n    return x * len(S)\n", "times_len", S={1, 2})
    return State(fn=fn, _g=g)


def add7_if_flag(x, cfg):
    return x + 7 if getattr(cfg, "add_7", False) else x


class Cfg:
    pass


def size_or_tuple(s, y):
    return y + 1 if isinstance(s, torch.Size) else y + 2


def add_times_one(a, b):
    return (a + b) * 1


# ---------------------------------------------------------------- C2: lazy iterators
def map_consumed_twice(a):
    m = map(lambda t: t + 1, [a, a])
    return len(list(m)), len(list(m))


def extend_with_lazy_map(a):
    y = [1]
    y.extend(map(lambda z: z + y[-1], range(3)))
    return a + 1, y


def returns_map(a):
    return map(lambda t: t * 2, [1, 2, 3]), a + 1


# ---------------------------------------------------------------- C3: in-place identity
def inplace_is_self(x):
    y = x.add_(1)
    return x is y


def set_of_inplace_results(x):
    y = x.add_(1)
    s = {x}
    s.add(y)
    return len(s)


# ---------------------------------------------------------------- C4: object state
def builds_exception(x):
    return x.sin(), StopIteration(1, 2, 3)


class MyList(list):
    pass


def list_new_subclass(x, klass):
    lst = list.__new__(klass)
    lst.append(x * 2)
    return lst


# ---------------------------------------------------------------- C5: submodule hooks
def _hooked_everywhere():
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    seen = []
    for name, sub in m.named_modules():
        sub.register_forward_hook(lambda mod, i, o, name=name: seen.append(name))
    return State(fn=m, seen=seen)


def _output_zeroing_hook():
    lin = nn.Linear(2, 2)
    lin.register_forward_hook(lambda mod, i, o: o * 0)
    return lin


# ---------------------------------------------------------------- C6: out= resize
def sigmoid_into_empty():
    out = torch.empty(0)
    torch.sigmoid(torch.zeros(3, 5), out=out)
    return tuple(out.size()), out


# ---------------------------------------------------------------- C7: the compiled module object
class CallTimesFive(nn.Module):
    def __call__(self, x):
        return 5 * self.forward(x)

    def forward(self, x):
        return x * 3


def _calls_global_module():
    fn, g = fresh_fn("def via_global(x):\n    return M(x)\n", "via_global", M=CallTimesFive())
    return State(fn=fn, _g=g)


# ---------------------------------------------------------------- C8: RNG
def _seeded_randint_state():
    # torch.manual_seed is wrapped by torch._disable_dynamo, whose first call imports
    # torch._dynamo; tempa traces that import for ~40 s (a compile-time problem of its own,
    # not what this case checks), so the import happens here, before the runs.
    import torch._dynamo  # noqa: F401
    return State(fn=seeded_randint)


def seeded_randint():
    torch.manual_seed(3)
    return torch.randint(0, 100, (5,))


def rng_state_round_trip():
    state = torch.get_rng_state()
    a = torch.rand(3)
    torch.set_rng_state(state)
    return bool((a == torch.rand(3)).all())


# ---------------------------------------------------------------- C9: mutated defaults
_DEFAULT_SRC = """
def mutator(x=torch.zeros(2), *, kw_x=torch.zeros(1)):
    x.add_(1)
    kw_x.add_(1)
    return x

def uses_defaults():
    return mutator()
"""


def _defaults_state():
    fn, g = fresh_fn(_DEFAULT_SRC, "uses_defaults")
    return State(fn=fn, defaults=g["mutator"].__defaults__, kwdefaults=g["mutator"].__kwdefaults__)


# ---------------------------------------------------------------- C10: locals()
def conditional_locals(x):
    if x.dim() > 2:
        b, s, h = x.shape
        x = x.view(-1, h)
    x = x + 1
    if "b" in locals():
        x = x.view(b, s, -1)
    return tuple(x.shape)


# ---------------------------------------------------------------- C11: invalid calls
def isinstance_bad_kwarg(x):
    return isinstance(x, torch.Tensor, invalid=True)


def map_strict(x, ys, zs):
    return [a + b for a, b in map(lambda a, b: (a, b), ys, zs, strict=True)]


# ---------------------------------------------------------------- C12: descriptors
class Field:
    def __set__(self, obj, value):
        obj.__dict__["field"] += value * 2


class Foo:
    field = Field()

    def __init__(self):
        self.__dict__["field"] = 0


def set_through_descriptor(x, foo):
    foo.field = 10
    return x + foo.field


CASES = [
    Case("c01_global_set_grows", _global_set_state,
         [call(torch.ones(1)), mutate(lambda s: s._g["S"].add(3), "S.add(3)"), call(torch.ones(1))]),
    Case("c01_getattr_flag_added_later", lambda: State(fn=add7_if_flag, cfg=Cfg()),
         [call(torch.ones(1), R("cfg")), mutate(lambda s: setattr(s.cfg, "add_7", True), "cfg.add_7 = True"),
          call(torch.ones(1), R("cfg"))]),
    fn_case("c01_isinstance_size_then_tuple", size_or_tuple, call(torch.Size([3]), torch.ones(1)),
            call((3,), torch.ones(1))),
    Case("c01_aliased_then_distinct_inputs", lambda: State(fn=add_times_one, a=torch.randn(4), b=torch.randn(4)),
         [call(R("a"), R("a")), call(R("a"), R("b"))]),
    fn_case("c02_map_consumed_twice", map_consumed_twice, call(torch.ones(2))),
    fn_case("c02_extend_with_lazy_map", extend_with_lazy_map, call(torch.ones(2))),
    fn_case("c02_returned_map_type", returns_map, call(torch.ones(2))),
    fn_case("c03_inplace_result_is_input", inplace_is_self, call(torch.ones(3))),
    fn_case("c03_set_of_inplace_results", set_of_inplace_results, call(torch.ones(3))),
    fn_case("c04_exception_object_args", builds_exception, call(torch.ones(1))),
    fn_case("c04_list_new_subclass", list_new_subclass, call(torch.ones(2), MyList)),
    Case("c05_hooks_on_every_submodule", _hooked_everywhere, [call(torch.ones(1, 3)), call(torch.ones(1, 3))]),
    module_case("c05_hook_changes_output", _output_zeroing_hook, call(torch.ones(1, 2))),
    fn_case("c06_out_argument_resized", sigmoid_into_empty, call()),
    Case("c07_bool_of_empty_modulelist", lambda: State(fn=nn.ModuleList()), [apply(lambda ctx, fn, s: bool(fn), "bool")]),
    Case("c07_module_overriding_call", _calls_global_module, [call(torch.ones(1))]),
    Case("c08_manual_seed_inside", _seeded_randint_state,
         [apply(lambda ctx, fn, s: bool((fn() == fn()).all()), "two calls equal")]),
    fn_case("c08_rng_state_round_trip", rng_state_round_trip, call()),
    Case("c09_default_tensor_mutated", _defaults_state, [call(), call(), call()]),
    fn_case("c10_in_locals_after_conditional", conditional_locals, call(torch.randn(2, 3, 4)), call(torch.randn(3, 4))),
    fn_case("c11_isinstance_invalid_kwarg", isinstance_bad_kwarg, call(torch.ones(1))),
    fn_case("c11_map_strict_on_311", map_strict, call(torch.ones(1), [1.0], [2.0])),
    fn_case("c12_data_descriptor_set", set_through_descriptor, call(torch.zeros(1), Lazy(lambda s: Foo()))),
]

"""The general corpus: ordinary programs that compile soundly today. They guard against
regressions; the ones with `breaks=forward_code` also run in the forced-break mode."""
import torch
import torch.nn.functional as F
from torch import nn

from ._util import fn_case, module_case, rnd
from .harness import (Case, Lazy, R, State, call, del_attr, forward_code, mutate, probe, requires_grad,
                      set_attr, zero_grad)


# ---------------------------------------------------------------- blocks
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc1(x)
        h = F.gelu(h)
        out = self.fc2(h)
        return out


class ConvBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        y = self.bn(y)
        y = F.relu(y)
        return F.max_pool2d(y, 2)


class Attention(nn.Module):
    def __init__(self, d=8, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        att = att.softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return x + self.proj(y)


class SdpaBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.lin(out)


class Counter(nn.Module):
    """Buffers and Python attributes changed by forward."""
    def __init__(self):
        super().__init__()
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("total", torch.zeros(4))
        self.calls = 0
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        self.steps.add_(1)
        self.total += x.sum(0)
        self.calls = self.calls + 1
        return self.lin(x) * self.calls


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.use_b = False
        self.scale = 1.0

    def forward(self, x):
        y = self.a(x)
        if self.use_b:
            y = self.b(y)
        return y * self.scale


class WithHelpers(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.heads = nn.ModuleDict({"cls": nn.Linear(4, 2), "reg": nn.Linear(4, 1)})

    def block(self, x, i):
        return torch.tanh(self.layers[i](x)) + x

    def forward(self, x, head="cls"):
        for i in range(len(self.layers)):
            x = self.block(x, i)
        return self.heads[head](x)


class DropoutEval(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(F.relu(self.lin(x)))


def _eval(m):
    return m.eval()


def _training_state():
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    return State(fn=model, opt=torch.optim.SGD(model.parameters(), lr=0.1))


def _opt_step(s):
    s.opt.step()
    s.opt.zero_grad(set_to_none=True)


def _loss_fn(model, x, target):
    out = model(x)
    loss = F.cross_entropy(out, target)
    return loss


# ---------------------------------------------------------------- functions
def inplace_arg(x):
    x.mul_(2)
    x[0] = -1.0
    return x.sum()


def inplace_intermediate(x):
    y = x * 2
    y.relu_()
    y += 1
    return y


def views(x):
    a = x.view(2, 6)
    b = x.t().contiguous()
    c = x.reshape(-1)[2:8].unsqueeze(0)
    return a + 1, b * 2, c.permute(1, 0)


def reductions(x):
    return x.sum(), x.mean(1), x.amax(0), x.argmax(1), x.prod(0), x.norm(), x.std(0)


def shape_control(x):
    if x.shape[0] > 2:
        return x.sum(0)
    if x.dim() == 2:
        return x * x.shape[1]
    return x


def tuple_list_io(pair, scale):
    a, b = pair
    return [a + b, a * scale, (b - a,)]


def dict_io(d):
    out = {"sum": d["a"] + d["b"], "n": len(d)}
    if "c" in d:
        out["c"] = d["c"] * 2
    return out


def kwargs_fn(x, *, scale=2.0, shift=0.0, act=None):
    y = x * scale + shift
    if act == "relu":
        y = y.relu()
    return y


def make_closure(k):
    offset = torch.full((3,), float(k))

    def inner(x):
        return x * k + offset
    return inner


GLOBAL_TABLE = torch.arange(6.0)
GLOBAL_SCALE = 3


def reads_globals(x):
    return x * GLOBAL_SCALE + GLOBAL_TABLE[: x.shape[-1]]


def int_ops(a, b):
    return a // b, a % b, a & b, a | 1, a > b, (a == b).sum(), a.float() / b


def masking(x, m):
    y = x.masked_fill(m, 0.0)
    return torch.where(m, x, -x), y, x[m]


def cat_split(x, y):
    z = torch.cat([x, y], dim=0)
    a, b = z.split([2, 4], dim=0)
    return torch.stack([a.sum(0), b.sum(0)]), z.chunk(3)[1] + 1


def matmuls(a, b, c):
    return a @ b, torch.bmm(a.unsqueeze(0), b.unsqueeze(0)), torch.einsum("ij,jk->ik", a, b) + c


def losses(logits, target):
    return F.cross_entropy(logits, target), F.log_softmax(logits, -1), F.mse_loss(logits.softmax(-1), logits.sigmoid())


def embedding_ok(idx, w):
    return F.embedding(idx, w).sum(1)


def python_scalars(x):
    n = x.shape[0] * 2
    s = x.sum().item()
    return n, s, float(x.max()), x.dim()


def local_list(x, n):
    out = []
    for i in range(n):
        out.append(x * i)
    return out


def helper(x, k=2):
    return x.sin() * k


def calls_helper(x):
    return helper(x) + helper(x, k=3)


def list_arg_append(x, acc):
    acc.append(x.sum())
    acc.append("seen")
    return x * 2


def dict_arg_str_keys(x, d):
    d["y"] = x + 1
    d["count"] = d.get("count", 0) + 1
    return d["y"] * 2


def no_grad_block(x, w):
    with torch.no_grad():
        scale = w.abs().mean()
    return x * w * scale


def nan_aware(x):
    return x.log(), x.sqrt(), x.clamp(min=0.5), x.abs().sign(), torch.nan_to_num(x.log(), nan=7.0)


def dtype_conversions(x):
    return x.double() * 2, x.to(torch.int64), x.half().float(), (x > 0).to(torch.uint8)


def broadcasting(a, b):
    return a + b, a * b.unsqueeze(-1).mean(), (a - b).pow(2).sum(-1)


def empty_tensors(x):
    return x.sum(), x * 2, torch.cat([x, x])


def optional_arg(x, mask=None):
    if mask is not None:
        x = x * mask
    return x.sum(-1)


def type_dispatch(x, y):
    if isinstance(y, torch.Tensor):
        return x + y
    return x * y


def string_mode(x, mode):
    if mode == "relu":
        return x.relu()
    if mode == "tanh":
        return torch.tanh(x)
    return x


def grad_of_input(x, w):
    return (x * w).sin().sum()


def noncontiguous_input(x):
    return x * 2 + x.sum(0, keepdim=True)


def returns_input_unchanged(x, y):
    return x, y + 1


def loop_accumulate(xs):
    total = torch.zeros(3)
    for i, t in enumerate(xs):
        total = total + t * (i + 1)
    return total


def nested_containers(cfg):
    return {"out": [cfg["a"][0] + cfg["a"][1], cfg["b"]["c"] * 2], "k": tuple(cfg["b"])}


def conditional_on_value(x):
    if x.sum() > 0:          # a data-dependent branch: a graph break
        return x * 2
    return x - 1


def set_and_del_local_state(x):
    y = x + 1
    del x
    z = y * 2
    return z


CASES = [
    module_case("mlp_forward", MLP, call(rnd(4, 8)), call(rnd(4, 8)), call(rnd(6, 8)),
                breaks=forward_code),
    module_case("mlp_train_step", MLP, call(rnd(4, 8), _backward=True), zero_grad(),
                call(rnd(4, 8), _backward=True)),
    module_case("conv_block_eval", lambda: _eval(ConvBlock()), call(rnd(2, 3, 8, 8)), call(rnd(2, 3, 8, 8)),
                breaks=forward_code),
    module_case("conv_bn_training_running_stats", ConvBlock, call(rnd(2, 3, 8, 8)), call(rnd(2, 3, 8, 8)),
                call(rnd(2, 3, 8, 8), _backward=True)),
    module_case("attention_block", Attention, call(rnd(2, 5, 8)), call(rnd(2, 5, 8), _backward=True),
                breaks=forward_code),
    module_case("sdpa_block", SdpaBlock, call(rnd(1, 2, 4, 8), rnd(1, 2, 4, 8), rnd(1, 2, 4, 8))),
    module_case("buffers_and_attrs_updated", Counter, call(rnd(3, 4)), call(rnd(3, 4)), call(rnd(3, 4)),
                breaks=forward_code),
    module_case("branch_on_module_attrs", Branchy, call(rnd(2, 4)),
                set_attr("fn", "use_b", lambda s: True), call(rnd(2, 4)),
                set_attr("fn", "scale", lambda s: 0.5), call(rnd(2, 4)),
                set_attr("fn", "note", lambda s: "unread"), call(rnd(2, 4)), del_attr("fn", "note"),
                call(rnd(2, 4)),
                breaks=forward_code),
    module_case("modulelist_moduledict_helpers", WithHelpers, call(rnd(2, 4)), call(rnd(2, 4), head="reg"),
                call(rnd(2, 4), _backward=True), breaks=forward_code),
    module_case("dropout_in_eval", lambda: _eval(DropoutEval()), call(rnd(3, 6)), call(rnd(3, 6))),
    Case("training_loop_with_optimizer", _training_state,
         [call(rnd(4, 5), _backward=True), mutate(_opt_step, "opt.step"),
          call(rnd(4, 5), _backward=True), mutate(_opt_step, "opt.step"), call(rnd(4, 5))]),
    Case("loss_fn_over_model", lambda: State(fn=_loss_fn, model=nn.Linear(5, 3)),
         [call(R("model"), rnd(4, 5), torch.tensor([0, 2, 1, 0]), _backward=True),
          call(R("model"), rnd(4, 5), torch.tensor([1, 1, 1, 2]), _backward=True)],
         breaks=lambda s: [_loss_fn.__code__]),
    module_case("weights_changed_in_place", MLP, call(rnd(2, 8)),
                mutate(lambda s: s.fn.fc1.weight.data.mul_(2), "fc1.weight *= 2"), call(rnd(2, 8))),
    module_case("freeze_then_unfreeze_eager_backend_sees", MLP, call(rnd(2, 8), _backward=True),
                requires_grad("fn.fc1", False), zero_grad(), call(rnd(2, 8), _backward=True)),
    fn_case("inplace_on_argument", inplace_arg, call(rnd(4)), call(rnd(4)),
            breaks=lambda s: [inplace_arg.__code__]),
    fn_case("inplace_on_intermediate", inplace_intermediate, call(rnd(5)), call(rnd(5))),
    fn_case("views_and_reshapes", views, call(rnd(3, 4)), call(rnd(3, 4))),
    fn_case("reductions", reductions, call(rnd(3, 5)), call(rnd(3, 5))),
    fn_case("control_flow_on_shapes", shape_control, call(rnd(3, 4)), call(rnd(2, 4)), call(rnd(2, 5)),
            breaks=lambda s: [shape_control.__code__]),
    fn_case("tuple_list_in_out", tuple_list_io, call((rnd(3), rnd(3)), 2.0), call((rnd(3), rnd(3)), 3.0)),
    fn_case("dict_in_out", dict_io, call({"a": rnd(2), "b": rnd(2)}), call({"a": rnd(2), "b": rnd(2), "c": rnd(2)}),
            breaks=lambda s: [dict_io.__code__]),
    fn_case("kwargs", kwargs_fn, call(rnd(3)), call(rnd(3), scale=3.0), call(rnd(3), shift=1.0, act="relu"),
            call(rnd(3), act=None, scale=-1.0)),
    Case("closure_cells", lambda: State(fn=make_closure(2)), [call(rnd(3)), call(rnd(3))]),
    fn_case("module_globals_read", reads_globals, call(rnd(4)), call(rnd(2, 6))),
    fn_case("integer_and_bool_ops", int_ops, call(torch.tensor([7, -3, 9]), torch.tensor([2, 2, -4])),
            call(torch.tensor([1, 5, 8]), torch.tensor([3, 1, 3]))),
    fn_case("masking", masking, call(rnd(2, 3), torch.tensor([[True, False, True], [False, False, True]]))),
    fn_case("cat_split_stack", cat_split, call(rnd(2, 3), rnd(4, 3))),
    fn_case("matmuls_einsum", matmuls, call(rnd(3, 4), rnd(4, 2), rnd(3, 2))),
    fn_case("losses_softmax", losses, call(rnd(4, 5), torch.tensor([0, 4, 2, 1]))),
    fn_case("embedding_valid_indices", embedding_ok, call(torch.tensor([[0, 2], [4, 1]]), rnd(5, 3))),
    fn_case("python_scalar_results", python_scalars, call(rnd(4)), call(rnd(5)),
            breaks=lambda s: [python_scalars.__code__]),
    fn_case("local_list_built_in_loop", local_list, call(rnd(2), 3), call(rnd(2), 3), call(rnd(2), 4),
            breaks=lambda s: [local_list.__code__]),
    fn_case("inlined_helper_calls", calls_helper, call(rnd(3)), call(rnd(3))),
    Case("list_argument_appended", lambda: State(fn=list_arg_append, acc=[]),
         [call(rnd(3), R("acc")), call(rnd(3), R("acc"))], breaks=lambda s: [list_arg_append.__code__]),
    Case("dict_argument_str_keys", lambda: State(fn=dict_arg_str_keys, d={"x": 1}),
         [call(rnd(2), R("d")), call(rnd(2), R("d"))], breaks=lambda s: [dict_arg_str_keys.__code__]),
    fn_case("no_grad_block", no_grad_block, call(rnd(3), rnd(3, requires_grad=True), _backward=True),
            breaks=lambda s: [no_grad_block.__code__]),
    fn_case("nan_inf_values", nan_aware, call(torch.tensor([-1.0, 0.0, 0.25, 4.0, float("nan")]))),
    fn_case("dtype_conversions", dtype_conversions, call(rnd(4))),
    fn_case("broadcasting", broadcasting, call(rnd(2, 3), rnd(3)), call(rnd(4, 3), rnd(3))),
    fn_case("empty_tensors", empty_tensors, call(torch.zeros(0)), call(torch.zeros(0, 3))),
    fn_case("optional_argument", optional_arg, call(rnd(2, 3)), call(rnd(2, 3), mask=rnd(2, 3)), call(rnd(2, 3))),
    fn_case("type_dispatch", type_dispatch, call(rnd(3), rnd(3)), call(rnd(3), 2.5), call(rnd(3), 4)),
    fn_case("string_mode", string_mode, call(rnd(3), "relu"), call(rnd(3), "tanh"), call(rnd(3), "none")),
    fn_case("gradient_of_inputs", grad_of_input, call(rnd(3, requires_grad=True), rnd(3), _backward=True),
            call(rnd(3), rnd(3, requires_grad=True), _backward=True)),
    fn_case("noncontiguous_input", noncontiguous_input, call(rnd(3, 4)), call(Lazy(lambda s: torch.arange(12.0).view(4, 3).t()))),
    fn_case("returns_an_input_unchanged", returns_input_unchanged, call(rnd(2), rnd(2))),
    fn_case("loop_over_tensor_list", loop_accumulate, call([rnd(3), rnd(3)]), call([rnd(3), rnd(3)]),
            breaks=lambda s: [loop_accumulate.__code__]),
    fn_case("nested_containers", nested_containers, call({"a": [rnd(2), rnd(2)], "b": {"c": rnd(2)}})),
    fn_case("data_dependent_branch", conditional_on_value, call(torch.ones(3)), call(-torch.ones(3)),
            breaks=lambda s: [conditional_on_value.__code__]),
    fn_case("del_local", set_and_del_local_state, call(rnd(3))),
    Case("grad_mode_probe", lambda: State(fn=grad_of_input),
         [call(rnd(3), rnd(3)), probe(lambda s: torch.is_grad_enabled(), "is_grad_enabled")]),
]


def returns_input_list(x, lst):
    lst.append(x.sum())
    return lst


def returns_dict_arg(x, d):
    d["y"] = x * 2
    return d, x + 1


CASES += [
    Case("returns_an_input_list", lambda: State(fn=returns_input_list, acc=[]),
         [call(rnd(3), R("acc")), call(rnd(3), R("acc"))]),
    Case("returns_an_input_dict", lambda: State(fn=returns_dict_arg, d={}),
         [call(rnd(2), R("d")), call(rnd(2), R("d"))]),
]

"""Edge-case families found by the soundness sweep (h4-sound): views and aliasing of
outputs (empty slices, dtype views, views after a size change, the autograd variant's
views), in-place writes eager refuses (overlapping memory, outputs of multi-view functions,
results a tensor cannot hold), explicit dunder writes, zero-element and 0-d reductions,
NaN semantics, integer and bool arithmetic, dtype promotion, half/bfloat16 accumulation,
conversions, strided / flipped / channels_last inputs, and one function called with
changing shapes and dtypes."""
import torch

from ._util import fn_case, rnd
from .harness import Lazy, call

NAN, INF = float("nan"), float("inf")


def _gen(seed=3):
    return torch.Generator().manual_seed(seed)


def lazy(make):
    """A tensor argument built per run (layouts a copy would not keep: expanded, sliced)."""
    return Lazy(lambda s: make(_gen()))


# ---------------------------------------------------------------- views and aliasing
def empty_slices(x):
    return x[5:2], x[:, 0:0], x[1:, 2:2] * 2, x.t()[2:2]


def dtype_views(z, x):
    return z.real, z.imag, torch.view_as_real(z)[1:], x.view(torch.int32), x * 2


def views_of_inputs(x):
    return x[1:], x.t(), x.view(-1), x.diagonal(), x.narrow(1, 1, 2), x.unfold(1, 2, 1), x + 1


def views_with_grad(x, w):
    y = x * w
    return x[1:], x.t(), y, y[1:], y.t(), x.detach()


def write_through_returned_view(x):
    v = x.t()
    v[0] = 5.0
    x.diagonal().mul_(2)
    x[1:].masked_fill_(x[1:] > 0.5, 0.0)
    return x, v


def expand_then_inplace(x):
    y = x.expand(4, 3)
    y.add_(1)
    return y


def expanded_copy_inplace(x):
    y = x.expand(4, 3).clone()
    y.add_(1)
    return y


def unbind_row_inplace(t):
    x = t * 2
    a, b = x.unbind(0)
    a.add_(1)
    return a + b


def chunk_row_inplace(t):
    x = t * 2
    a, b = x.chunk(2)
    a.mul_(3)
    return x


def bool_times_int_inplace(x):
    x.mul_(2)
    return x


def explicit_setitem(x):
    x.__setitem__(0, 5.0)
    torch.Tensor.__setitem__(x, (slice(None), 1), -1.0)
    return x.sum()


# ---------------------------------------------------------------- values
def empty_reductions(x):
    return x.sum(0), x.sum(), x.mean(0), x.amax(1), x.prod(0), x.softmax(0), x.logsumexp(0)


def amax_of_empty(x):
    return x.amax(0)


def zero_dim(x, n):
    return x * 2, x.sum(), x.amax(), x.view(1), n // 2 + n.sum(), x + n


def nan_semantics(x, y):
    return (x.max(1), x.min(1), x.amax(1), x.amin(0), x.argmax(1), x.argmin(0),
            x.clamp(0.5, 2.5), x.clamp(min=1.0), torch.maximum(x, y), torch.minimum(x, y),
            torch.fmax(x, y), torch.fmin(x, y), x.sort(1), x.sort(1, descending=True),
            x.topk(2, 1), x.relu(), x.sign(), x.nan_to_num(), x.nansum(1), x.cummax(1),
            torch.where(x > 1, x, -x))


def infinities(x):
    return x.logsumexp(1), x.softmax(1), x.exp(), x.sigmoid(), x.tanh(), 1 / x


def integer_arithmetic(x, y):
    return (x / 2, x // 2, x % 3, x.remainder(-3), torch.fmod(x, 3), torch.floor_divide(x, -2),
            x / y, x // y, x % y, torch.fmod(x, y), torch.div(x, y, rounding_mode="trunc"),
            x & y, x | y, x ^ y, ~x, x ** 2, x.mean(dtype=torch.float32), x.clamp(-2, 2))


def overflow_wraps(i32, i64, u8, i8):
    return (i32 + 1, i32 * 2, -i32, i64 * 3, i64 + 1, i64.sum(), u8 + 100, u8 - 1, -u8, u8 * 2,
            i8 + 1, -i8, i8.abs())


def shifts(x, s):
    return x << s, x >> s, x << 2, x >> 1


def bools(a, b):
    return a & b, a | b, a ^ b, ~a, a + b, a * b, a.sum(), a.float().mean(), a.int() - b.int()


def promotion(i, h, d, s):
    return (i + 1.5, i * 2, i + True, (i > 0) + 1, (i > 0) * 1.5, h + d, h * d, i + d,
            h + s, i / s, torch.where(i > 1, i, 0.5))


def low_precision_sums(h, b):
    return h.sum(), h.mean(), h.cumsum(0)[-1], h.var(), b.sum(), b.mean(), b.softmax(0).sum(), \
        (h * 3.3 + 1.1) * 0.7 - h


def conversions(x, big):
    return (x.int(), x.long(), x.to(torch.int16), x.round(), x.trunc(), x.frac(),
            x.round(decimals=1), big.double(), big.float(), big + 1, big // 7)


# ---------------------------------------------------------------- layouts
def layouts(x):
    return x * 2, x.sum(1), x.exp(), x.flip(0) + 1, x.flip(1).cumsum(1), x.contiguous(), x.clone()


def channels_last(x, w):
    return x * 2, x.relu(), x.mean((2, 3)), torch.nn.functional.conv2d(x, w).relu(), torch.ones_like(x)


def broadcast_stride_zero(x, y):
    return x * y + x, (x + y).sum(0)


def shape_and_dtype_changes(x):
    return x[1:] * 2, x.sum(-1), x.transpose(0, -1), x.amax(0), x // 2


def _nan_pair():
    return (torch.tensor([[1.0, NAN, 3.0], [NAN, 2.0, 0.0]]),
            torch.tensor([[NAN, 0.0, 5.0], [1.0, NAN, NAN]]))


CASES = [
    fn_case("sound_empty_slices_are_views", empty_slices, call(rnd(4, 3)), call(rnd(4, 3))),
    fn_case("sound_dtype_views", dtype_views, call(torch.randn(3, dtype=torch.complex64, generator=_gen()), rnd(4))),
    fn_case("sound_views_of_inputs", views_of_inputs, call(rnd(3, 4)), call(rnd(3, 4)), check_version=True),
    fn_case("sound_views_of_inputs_as_sizes_change", views_of_inputs, call(rnd(3, 4)), call(rnd(5, 4)),
            call(rnd(6, 4)), call(rnd(6, 5))),
    fn_case("sound_views_with_grad", views_with_grad,
            call(rnd(3, 4, requires_grad=True), rnd(4, requires_grad=True), _backward=True),
            call(rnd(5, 4, requires_grad=True), rnd(4, requires_grad=True), _backward=True)),
    fn_case("sound_write_through_returned_views", write_through_returned_view, call(rnd(3, 3)),
            call(rnd(3, 3)), check_version=True),
    fn_case("sound_expand_then_inplace_raises", expand_then_inplace, call(rnd(1, 3)), call(rnd(1, 3))),
    fn_case("sound_expanded_copy_inplace", expanded_copy_inplace, call(rnd(1, 3)), call(rnd(3))),
    fn_case("sound_inplace_on_expanded_input_raises", lambda x: x.add_(1),
            call(lazy(lambda g: torch.randn(4, generator=g).expand(3, 4)))),
    fn_case("sound_unbind_row_inplace_raises", unbind_row_inplace,
            call(rnd(2, 3, requires_grad=True)), call(rnd(2, 3))),
    fn_case("sound_chunk_row_inplace_raises", chunk_row_inplace,
            call(rnd(2, 3, requires_grad=True)), call(rnd(2, 3))),
    fn_case("sound_inplace_result_dtype_raises", bool_times_int_inplace,
            call(torch.tensor([True, False])), call(torch.tensor([1.5, 2.0]))),
    fn_case("sound_explicit_setitem", explicit_setitem, call(rnd(2, 3)), check_version=True),
    fn_case("sound_empty_reductions", empty_reductions, call(rnd(0, 3)), call(rnd(0, 3))),
    fn_case("sound_amax_of_empty_raises", amax_of_empty, call(rnd(0, 3))),
    fn_case("sound_zero_dim", zero_dim, call(torch.tensor(3.0), torch.tensor(7)),
            call(torch.tensor(-2.0), torch.tensor(-7))),
    fn_case("sound_nan_semantics", nan_semantics, call(*_nan_pair())),
    fn_case("sound_infinities", infinities,
            call(torch.tensor([[-INF, -INF], [INF, 1.0], [-0.0, 0.0]]))),
    fn_case("sound_integer_arithmetic", integer_arithmetic,
            call(torch.tensor([-7, -3, 0, 3, 7, 2**31 - 1]), torch.tensor([2, -2, 3, -3, 5, 7]))),
    fn_case("sound_integer_division_by_zero_raises", lambda x, y: x // y,
            call(torch.tensor([1, 2]), torch.tensor([0, 1]))),
    fn_case("sound_overflow_wraps", overflow_wraps,
            call(torch.tensor([2**31 - 1, -2**31], dtype=torch.int32), torch.tensor([2**62, -2**62, 2**53 + 1]),
                 torch.tensor([0, 1, 200, 255], dtype=torch.uint8), torch.tensor([-128, -1, 0, 127], dtype=torch.int8))),
    fn_case("sound_shifts", shifts, call(torch.tensor([1, -8, 255, 2**40]), torch.tensor([1, 2, 63, 3]))),
    fn_case("sound_bools", bools, call(torch.tensor([True, False, True]), torch.tensor([True, True, False]))),
    fn_case("sound_promotion", promotion,
            call(torch.tensor([-1, 2, 3]), rnd(3, dtype=torch.float16), torch.tensor(2.0, dtype=torch.float64),
                 torch.tensor(2.5))),
    fn_case("sound_low_precision_sums", low_precision_sums,
            call(1 + rnd(4096, dtype=torch.float16) * 0.01, 1 + rnd(4096, dtype=torch.bfloat16) * 0.01)),
    fn_case("sound_conversions", conversions,
            call(torch.tensor([-2.7, -0.5, 0.5, 1.5, 2.5, 127.9]), torch.tensor([2**62, -2**62, 2**53 + 1]))),
    fn_case("sound_layouts", layouts, call(rnd(4, 3).t()),
            call(lazy(lambda g: torch.randn(4, 8, generator=g)[:, ::2])), call(rnd(4, 4))),
    fn_case("sound_channels_last", channels_last,
            call(lazy(lambda g: torch.randn(2, 3, 8, 8, generator=g).to(memory_format=torch.channels_last)),
                 rnd(4, 3, 3, 3))),
    fn_case("sound_broadcast_stride_zero", broadcast_stride_zero,
            call(lazy(lambda g: torch.randn(1, 4, generator=g).expand(3, 4)), rnd(3, 1))),
    fn_case("sound_shape_and_dtype_changes", shape_and_dtype_changes,
            call(rnd(3, 4)), call(rnd(5, 4)), call(rnd(5, 6)), call(rnd(3, 4, dtype=torch.float64)),
            call(torch.tensor([[3, -7, 2], [5, 1, -1]])), call(rnd(4, 3).t()),
            call(rnd(3, 4, requires_grad=True), _backward=True), call(rnd(2, 3, 4)), call(rnd(3, 4))),
]

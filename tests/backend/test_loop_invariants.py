"""Loop-invariant values are computed in the outermost loop that defines what they read
(codegen/emit.py): BatchNorm's per-channel scale in the channel loop, not per element. A
value leaves a branch only when computing it cannot fault: a load whose index is in bounds
for every value of its loops, from a buffer no loop of the group writes; no integer
division. The results are eager's (the same operations, computed once)."""
import torch
import torch.nn.functional as F

from tempa.backend.codegen.emit import Emitter
from tempa.backend.index import Cond, IndexExpr, Var
from tempa.backend.ir import Buffer, ScalarExpr

from .helpers import close, compile_fn


def _kernel_lines(c):
    return [l.strip() for l in c.tempa_info.cpp_source.splitlines()]


def _loop_depth_of(lines, needle):
    """How many loops are open at the first line containing ``needle``."""
    depth = 0
    for l in lines:
        if needle in l:
            return depth
        if l.startswith("for ("):
            depth += 1
        elif l == "}" and depth:
            depth -= 1
    raise AssertionError(f"{needle!r} not in the kernel")


def _bn_relu6_pad(x, mean, var, w, b):
    y = F.batch_norm(x, mean, var, w, b, training=False, eps=1e-3).clamp(0, 6)
    return F.pad(y, (0, 1, 0, 1))            # TF "same" padding before a stride-2 depthwise conv


def _bn_inputs(c=6, h=9):
    torch.manual_seed(0)
    return (torch.randn(1, c, h, h), torch.randn(c), torch.rand(c) + 0.5, torch.randn(c),
            torch.randn(c))


def test_batchnorm_scale_is_computed_per_channel_under_the_padding():
    inputs = _bn_inputs()
    c = compile_fn(_bn_relu6_pad, *inputs)
    assert close(c(*inputs), _bn_relu6_pad(*inputs))
    lines = _kernel_lines(c)
    # the channel loop is the only one open where 1 / sqrt(var + eps) is computed
    assert _loop_depth_of(lines, "m::sqrt(") == 1, c.tempa_info.cpp_source


def test_layer_norm_rows_match_eager():
    torch.manual_seed(0)
    x, w, b = torch.randn(5, 33), torch.randn(33), torch.randn(33)

    def fn(x, w, b):
        return F.layer_norm(x, (33,), w, b) * 2
    c = compile_fn(fn, x, w, b)
    assert close(c(x, w, b), fn(x, w, b))


def test_concatenated_channels_read_each_scale_only_in_its_own_branch():
    """cat's piecewise reads ``s2[x0 - 3]`` only for x0 >= 3: out of bounds for the other
    channels, so that load must stay in its branch (computed per channel is fine)."""
    torch.manual_seed(0)
    a, b = torch.randn(3, 4, 5), torch.randn(2, 4, 5)
    s1, s2 = torch.randn(3, 1, 1), torch.randn(2, 1, 1)

    def fn(a, b, s1, s2):
        return torch.cat([a * s1, b * s2]).sqrt().clamp(0, 6) + 1
    c = compile_fn(fn, a, b, s1, s2)
    assert close(c(a, b, s1, s2), fn(a, b, s1, s2))


# --- the emitter's rules, on the rendering itself ----------------------------------------

def _emitter():
    k = Emitter()
    k.open_block()
    return k


def _buf(name, n):
    return Buffer(name, (n,), (1,), 0, torch.float32, kind="input")


def _emit_in_branch(k, body):
    """Render ``body(k)`` inside a branch of the innermost loop; the flattened lines."""
    k.piecewise([(Cond.compare(Var("x1", 8), ">=", 1), body),
                 (Cond(), lambda k: k.const(0.0, torch.float32))], torch.float32)
    return _flat(k)


def _flat(k):
    k.flatten()
    return [l.strip() for l in k.lines]


def _loops(k, *sizes):
    vs = [Var(f"x{i}", s) for i, s in enumerate(sizes)]
    for v in vs:
        k.open_loop(v)
    return vs


def test_in_bounds_load_leaves_the_branch_and_its_inner_loop():
    k = _emitter()
    x0, _ = _loops(k, 4, 8)
    scale = _buf("scale", 4)
    lines = _emit_in_branch(k, lambda k: k.op("sqrt", [k.load(scale, IndexExpr.of(x0))], torch.float32))
    assert _loop_depth_of(lines, "scale[x0]") == 1
    assert _loop_depth_of(lines, "m::sqrt(") == 1
    assert lines.index("for (int64_t x1 = 0; x1 < 8; ++x1) {") > lines.index(
        next(l for l in lines if "scale[x0]" in l))


def test_load_out_of_bounds_for_some_iterations_stays_in_its_branch():
    k = _emitter()
    x0, _ = _loops(k, 5, 8)
    tail = _buf("tail", 2)                    # read at x0 - 3 only where x0 >= 3
    lines = _emit_in_branch(k, lambda k: k.load(tail, IndexExpr.of(x0) - 3))
    assert _loop_depth_of(lines, "tail[x0 - 3]") == 2
    assert lines.index(next(l for l in lines if "tail[" in l)) > lines.index("if ((x1) >= 1) {")


def test_load_of_a_buffer_the_group_writes_stays_below_its_outer_loops():
    k = _emitter()
    x0, _ = _loops(k, 4, 8)
    k.group_frames = 3                        # the block and both loops are the group's
    k.written = {"out"}
    k.load(_buf("out", 4), IndexExpr.of(x0))
    assert _loop_depth_of(_flat(k), "out[x0]") == 2


def test_load_of_a_buffer_an_earlier_member_wrote_is_read_after_that_store():
    """A row's statistics (BatchNorm's batch mean) stored by one member and read by the next
    member's element loop: read once per row, after the store, before the element loop."""
    k = _emitter()
    (x0,) = _loops(k, 4)
    k.group_frames = 2
    k.written = {"mean", "out"}
    k.line("mean[x0] = 1.0f;")
    k.writing = "out"
    k.open_loop(Var("i", 8))
    k.op("sqrt", [k.load(_buf("mean", 4), IndexExpr.of(x0))], torch.float32)
    k.load(_buf("out", 4), IndexExpr.of(x0))      # its own buffer: never moved
    lines = _flat(k)
    read = lines.index(next(l for l in lines if "= mean[x0]" in l))
    assert lines.index("mean[x0] = 1.0f;") < read < lines.index("for (int64_t i = 0; i < 8; ++i) {")
    assert _loop_depth_of(lines, "m::sqrt(") == 1
    assert _loop_depth_of(lines, "out[x0]") == 2


def test_load_of_an_empty_buffer_is_not_hoisted():
    """An inner loop of zero trips never reads; hoisted, the read would happen."""
    k = _emitter()
    x0, _ = _loops(k, 4, 0)
    empty = Buffer("empty", (4, 0), (0, 1), 0, torch.float32, kind="input")
    k.load(empty, IndexExpr.of(x0) * 0)
    assert _loop_depth_of(_flat(k), "empty[") == 2


def test_integer_division_stays_in_its_branch_float_math_leaves_it():
    k = _emitter()
    x0, _ = _loops(k, 4, 8)
    n, d = _buf("n", 4), _buf("d", 4)

    def body(k):
        ni = k.cast(k.load(n, IndexExpr.of(x0)), torch.int64)
        di = k.cast(k.load(d, IndexExpr.of(x0)), torch.int64)
        q = k.op("div", [ni, di], torch.int64)
        f = k.op("div", [k.load(n, IndexExpr.of(x0)), k.load(d, IndexExpr.of(x0))], torch.float32)
        return k.op("add", [k.cast(q, torch.float32), f], torch.float32)
    lines = _emit_in_branch(k, body)
    int_div = next(l for l in lines if l.startswith("const int64_t") and " / " in l)
    float_div = next(l for l in lines if l.startswith("const float") and " / " in l)
    assert lines.index(int_div) > lines.index("if ((x1) >= 1) {")
    assert lines.index(float_div) < lines.index("for (int64_t x1 = 0; x1 < 8; ++x1) {")


def test_value_reading_an_inline_value_is_declared_after_it():
    """A local computed inline in a loop (a row's reduction result) is read in the tail of
    that loop (after its line, before the loop inside), not in the slot above its line."""
    k = _emitter()
    (x0,) = _loops(k, 4)
    k.line("const float v_row = 1.0f;")
    k.defined("v_row")
    k.open_loop(Var("x1", 8))
    k.op("sqrt", [k.load(_buf("w", 4), IndexExpr.of(x0))], torch.float32)
    row = ScalarExpr("v_row", torch.float32)
    k.op("mul", [row, row], torch.float32)
    lines = _flat(k)
    mul = next(l for l in lines if "v_row * v_row" in l)
    assert lines.index("const float v_row = 1.0f;") < lines.index(mul) < \
        lines.index("for (int64_t x1 = 0; x1 < 8; ++x1) {")
    assert lines.index(next(l for l in lines if "w[x0]" in l)) < lines.index("const float v_row = 1.0f;")

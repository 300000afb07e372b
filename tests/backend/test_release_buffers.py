"""The CPU wrapper releases an intermediate of 64 KiB or more right after its last use
(codegen/wrapper.py release_after_last_use), as eager frees a tensor when its last user has
run. Why: held until the call returned, all of a BERT-base forward's intermediates were
live at once, and freeing them together at the return made glibc hand the heap's top back
to the kernel, so every call page-faulted ~7 MB of fresh memory (benchmarks/README.md)."""
import weakref

import torch
import torch.nn.functional as F

import tempa

_outputs: list = []          # weak references to every result of tempa_test::step
_most_alive = [0]


@torch.library.custom_op("tempa_test::release_step", mutates_args=())
def _step(x: torch.Tensor) -> torch.Tensor:
    _most_alive[0] = max(_most_alive[0], sum(r() is not None for r in _outputs))
    out = x * 2 + 1
    _outputs.append(weakref.ref(out))
    return out


@_step.register_fake
def _(x):
    return torch.empty_like(x)


def _chain(x):
    for _ in range(8):
        x = _step(torch.relu(x))      # an ATen call (the custom op) between C++ kernels
    return x


def _most_alive_during(fn, x):
    _outputs.clear()
    _most_alive[0] = 0
    fn(x)
    return _most_alive[0]


def test_intermediates_die_at_their_last_use_as_in_eager():
    tempa.reset()
    x = torch.randn(256, 256)         # 256 KiB a tensor
    c = tempa.compile(_chain)
    with torch.no_grad():
        torch.testing.assert_close(c(x), _chain(x))
        tempa_alive = _most_alive_during(c, x)
        eager_alive = _most_alive_during(_chain, x)
    # held to the return, the 7 earlier results were all still alive at the 8th step
    assert tempa_alive <= eager_alive, (tempa_alive, eager_alive)
    (entry,) = tempa.entries(c)
    assert "del buf" in entry.kernels.inference.passes["wrap"]


def test_small_intermediates_are_left_to_the_return():
    # a few microseconds a call: a del statement each would cost more than it frees
    tempa.reset()
    c = tempa.compile(_chain)
    with torch.no_grad():
        c(torch.randn(8, 8))
    (entry,) = tempa.entries(c)
    assert "del " not in entry.kernels.inference.passes["wrap"]


def test_released_names_are_never_read_again():
    # multi-result ATen calls (attention), a buffer written over a dying one (GELU over a
    # GEMM's output), an output that is a view of an intermediate, an intermediate returned
    torch.manual_seed(0)
    qkv, up, down = torch.nn.Linear(64, 192), torch.nn.Linear(64, 512), torch.nn.Linear(512, 64)

    def block(x):
        b, t, _ = x.shape
        q, k, v = (y.view(b, t, 4, 16).transpose(1, 2) for y in qkv(x).split(64, -1))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, 64)
        h = F.gelu(up(a))
        return down(h) + x, h[:, :4], a

    tempa.reset()
    x = torch.randn(2, 128, 64)
    c = tempa.compile(block)
    with torch.no_grad():
        for _ in range(2):
            for got, want in zip(c(x), block(x)):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    (entry,) = tempa.entries(c)
    assert "del " in entry.kernels.inference.passes["wrap"]


def test_shape_generic_code_releases_alike_at_every_size():
    # shape-generic wrappers are rendered at sample sizes whose texts must agree: every
    # bound buffer is released there, whatever its size at a sample
    torch.manual_seed(0)
    lin = torch.nn.Linear(4096, 64)

    def f(x):                      # 16 KiB a row: the sample sizes straddle 64 KiB
        return torch.relu(lin(torch.tanh(x)) * 2)

    tempa.reset()
    c = tempa.compile(f, dynamic=True)
    with torch.no_grad():
        for rows in (3, 9, 5):
            x = torch.randn(rows, 4096)
            torch.testing.assert_close(c(x), f(x))
    s = tempa.stats()
    assert s.captures == 1 and s.gcc_runs <= 2, s     # one generic graph, not one per size

"""Index checks in C++ kernels (codegen/emit.py flag_out_of_range): each check of a segment
owns a bit of the ``err`` it returns, ORed in every iteration, and the wrapper raises the
error eager raises for the first op that failed (ir.failed_check).

Why bits ORed in: the earlier "keep the largest code" select with a max reduction stopped
gcc vectorising the loop (a LayerNorm over gathered embeddings ran 8x slower)."""
import pytest
import torch

from tempa.backend.ir import ERR_BITS, failed_check

from .helpers import compile_fn


def _embed_then_gather(w, i, src, j):
    # one row loop reads both: embedding (IndexError in eager) and gather (RuntimeError)
    return torch.embedding(w, i) + torch.gather(src, 1, j)


def _inputs(i_bad=False, j_bad=False):
    g = torch.Generator().manual_seed(0)
    w, src = torch.randn(6, 4, generator=g), torch.randn(3, 4, generator=g)
    i = torch.tensor([0, 5 if not i_bad else 6, 2])
    j = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0], [1, 1, 4 if j_bad else 2, 0]])
    return w, i, src, j


def _eager_error(args):
    with pytest.raises(Exception) as e:
        _embed_then_gather(*args)
    return e.type


@pytest.fixture(scope="module")
def compiled():
    return compile_fn(_embed_then_gather, *_inputs())


def test_both_checks_are_bits_ored_in_one_kernel(compiled):
    src = compiled.tempa_info.cpp_source
    assert "err |= static_cast<int>(" in src and "<< 0;" in src and "<< 1;" in src
    assert "reduction(|:err)" in src or "#pragma omp" not in src
    assert "err = (" not in src              # no select-and-max form left
    assert "aten.embedding" not in str(compiled.tempa_info.inference.passes["render"])


@pytest.mark.parametrize("i_bad,j_bad", [(True, False), (False, True), (True, True)])
def test_the_error_is_eagers(compiled, i_bad, j_bad):
    args = _inputs(i_bad, j_bad)
    expected = _eager_error(args)
    assert expected is (IndexError if i_bad else RuntimeError)
    with pytest.raises(expected):
        compiled(*args)


def test_in_range_matches_eager(compiled):
    args = _inputs()
    torch.testing.assert_close(compiled(*args), _embed_then_gather(*args), rtol=0, atol=0)


def test_failed_check_takes_the_lowest_bit_and_the_shared_last_bit():
    checks = tuple(("IndexError", f"m{n}") for n in range(40))
    assert failed_check(0b100, checks) == ("IndexError", "m2")
    assert failed_check(0b110, checks) == ("IndexError", "m1")
    assert failed_check(1 << (ERR_BITS - 1), checks) == ("IndexError", "m30")
    mixed = checks[:35] + (("RuntimeError", "r"),)
    assert failed_check(1 << (ERR_BITS - 1), mixed) is None     # the caller's generic IndexError

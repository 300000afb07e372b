"""A big graph's C++ compiled as several translation units at once (runtime/build.py): the
library holds every segment and computes what the one-unit build computes; a unit that
does not compile leaves the one-unit build to report the compiler's error."""
from __future__ import annotations

import ctypes

import pytest
import torch

import tempa
from tempa.backend.codegen import cpp
from tempa.backend.runtime import build as B


def _segment(i: int) -> str:
    return (f'extern "C" int seg{i}(float* __restrict__ out, const float* __restrict__ x) {{\n'
            f"  for (int64_t j = 0; j < 64; ++j) out[j] = m::exp(x[j]) * {i + 1};\n  return 0;\n}}\n")


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    monkeypatch.setattr(tempa.config, "disk_cache", False)
    monkeypatch.setattr(B, "_jobs", lambda: 2)
    calls = []
    real = B._compile_in_parts

    def spy(exe, units, out_so, workdir):
        calls.append(len(units))
        return real(exe, units, out_so, workdir)
    monkeypatch.setattr(B, "_compile_in_parts", spy)
    return calls


def _call(lib, name, x):
    out = torch.empty_like(x)
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    assert fn(out.data_ptr(), x.data_ptr()) == 0
    return out


def test_segments_compiled_in_two_units_work(fresh_build, monkeypatch):
    monkeypatch.setattr(B, "PARALLEL_MIN_BYTES", 0)
    prelude = cpp.prelude()
    segments = [_segment(i) for i in range(5)]
    source = prelude + "\n\n" + "\n\n".join(segments) + "\n"
    lib, so, cached = B.build(source, prelude, segments)
    assert fresh_build == [2] and not cached
    x = torch.linspace(-2, 2, 64)
    for i in range(5):
        torch.testing.assert_close(_call(lib, f"seg{i}", x), torch.exp(x) * (i + 1))


def test_units_hold_every_segment_once():
    segments = [_segment(i) * (i + 1) for i in range(7)]
    units = B._units("// prelude", segments, 3)
    assert len(units) == 3
    for seg in segments:
        assert sum(u.count(seg) for u in units) >= 1
    assert sum(u.count('extern "C"') for u in units) == sum(s.count('extern "C"') for s in segments)


def test_a_small_source_is_one_unit(fresh_build):
    prelude = cpp.prelude()
    segments = [_segment(0), _segment(1)]
    B.build(prelude + "\n\n" + "\n\n".join(segments) + "\n", prelude, segments)
    assert fresh_build == []


def test_a_unit_that_fails_leaves_the_error_to_the_one_unit_build(fresh_build, monkeypatch):
    monkeypatch.setattr(B, "PARALLEL_MIN_BYTES", 0)
    prelude = cpp.prelude()
    segments = [_segment(0), 'extern "C" int broken() { return undeclared_name; }\n']
    with pytest.raises(B.BuildError, match="undeclared_name"):
        B.build(prelude + "\n\n" + "\n\n".join(segments) + "\n", prelude, segments)
    assert fresh_build == [2]

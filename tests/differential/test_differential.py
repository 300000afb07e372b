"""Every case of cases_*.py, eager vs compiled (backends "eager" and "tempa"), step by step;
and the forced-break mode: the cases with `breaks` run once per statement of their code
with a graph break forced there (tempa.capture.interpreter.FORCED_BREAKS)."""
import pytest

from tempa.capture import liveness

from . import cases_bugs, cases_general, cases_peer, cases_sound
from .harness import State, check_case, seed_everything
from .known_failures import KNOWN_FAILURES

ALL_CASES = cases_general.CASES + cases_bugs.CASES + cases_peer.CASES + cases_sound.CASES


def _unique(cases):
    ids = [c.id for c in cases]
    dupes = {i for i in ids if ids.count(i) > 1}
    assert not dupes, f"duplicate case ids: {sorted(dupes)}"
    stale = set(k.removeprefix("break:").split("@")[0] for k in KNOWN_FAILURES) - set(ids)
    assert not stale, f"KNOWN_FAILURES names cases that do not exist: {sorted(stale)}"
    return cases


def _shown(diffs, limit=15):
    more = f"\n  ... and {len(diffs) - limit} more" if len(diffs) > limit else ""
    return "\n  ".join(diffs[:limit]) + more


def _param(case, key, *values, id):  # noqa: A002 - pytest.param spelling
    # raises=: only a reported difference is the expected failure; a crash of the harness
    # itself (or of a case's setup) still fails the run.
    marks = [pytest.mark.xfail(strict=True, raises=pytest.fail.Exception, reason=KNOWN_FAILURES[key])] \
        if key in KNOWN_FAILURES else []
    return pytest.param(case, *values, id=id, marks=marks)


@pytest.mark.parametrize("case", [_param(c, c.id, id=c.id) for c in _unique(ALL_CASES)])
def test_case(case):
    diffs = check_case(case)
    if diffs:
        pytest.fail("compiled differs from eager:\n  " + _shown(diffs), pytrace=False)


def _break_points(case):
    """(index of the code object, offset) for every statement start of the case's code."""
    seed_everything(case.seed)
    state: State = case.setup()
    points = []
    for i, code in enumerate(case.breaks(state)):
        points += [(i, off) for off, _depth in liveness.statement_starts_with_depth(code)]
    if case.teardown is not None:
        case.teardown(state)
    return points


def _break_params():
    for case in ALL_CASES:
        if case.breaks is not None:
            for point in _break_points(case):
                test_id = f"{case.id}@{point[0]}:{point[1]}"
                key = f"break:{test_id}" if f"break:{test_id}" in KNOWN_FAILURES else f"break:{case.id}"
                yield _param(case, key, point, id=test_id)


@pytest.mark.parametrize("case,point", list(_break_params()))
def test_case_broken_at_statement(case, point):
    diffs = check_case(case, forced_breaks=[point])
    if diffs:
        pytest.fail(f"with a graph break forced at {point}, compiled differs from eager:\n  " + _shown(diffs),
                    pytrace=False)

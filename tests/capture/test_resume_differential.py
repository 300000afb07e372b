"""Differential test of graph breaks on real forwards: force a break at every statement
start of a model's forward, compile, and check the result equals eager. Resuming at an
arbitrary statement exercises value-stack rebuilding, NULLs, cells, loops, with-blocks and
exception tables on real code (nn layers, the GPT, HuggingFace models)."""
import functools
import sys

import pytest
import torch

import tempa
from tempa.capture import interpreter, liveness
from tests.models import zoo
from tests.models.compare import assert_same, clone_case, run_eager


def _forward_code(module):
    fn = type(module).forward
    while hasattr(fn, "__wrapped__"):   # HF decorators: the user's forward is inside
        fn = fn.__wrapped__
    return fn.__code__


def _cases():
    for name in ["gpt", "transformer_encoder_layer", "multihead_attention", "batchnorm2d_train",
                 "hf_bert", "hf_gpt2", "hf_llama", "hf_t5_encoder", "hf_vit"]:
        case = zoo.make(name)
        targets = [case.model]
        inner = {"gpt": lambda m: m.transformer.h[0].attn,
                 "hf_llama": lambda m: m.model.layers[0].self_attn,
                 "hf_bert": lambda m: m.encoder.layer[0].attention.self}.get(name)
        if inner is not None:
            targets.append(inner(case.model))
        for target in targets:
            code = _forward_code(target)
            for offset in liveness.statement_starts(code):
                yield pytest.param(name, code, offset, id=f"{name}-{code.co_name}-{code.co_firstlineno}@{offset}")


@functools.lru_cache(maxsize=None)
def _offsets_reached(name, code):
    """The instructions of ``code`` that eager executes on the case (a statement in a branch
    not taken, or after an early return, is never reached): traced once per code object."""
    reached = set()

    def trace(frame, event, arg):
        if frame.f_code is not code:
            return None
        frame.f_trace_opcodes = True
        if event == "opcode":
            reached.add(frame.f_lasti)
        return trace
    case = zoo.make(name)
    sys.settrace(trace)
    try:
        run_eager(case)
    finally:
        sys.settrace(None)
    return frozenset(reached)


@pytest.mark.parametrize("name,code,offset", list(_cases()))
def test_forced_break_matches_eager(name, code, offset):
    case = zoo.make(name)
    expected = run_eager(clone_case(case))
    interpreter.FORCED_BREAKS.add((code, offset))
    try:
        fast = tempa.compile(case.model, backend="eager")
        torch.manual_seed(case.seed)
        out = fast(*case.args, **case.kwargs)
        counts = tempa.stats()
    finally:
        interpreter.FORCED_BREAKS.discard((code, offset))
    assert_same(out, expected, *case.tolerance)
    # captured, and the forced break (where eager reaches it) resumed: no eager fallback
    assert counts.captures >= 1 and counts.eager_fallbacks == 0, counts
    reached = _offsets_reached(name, code)
    if reached:   # (empty: sys.settrace never saw the frame, as on the GPU machine's 3.12)
        assert (counts.graph_breaks >= 1) == (offset in reached), counts

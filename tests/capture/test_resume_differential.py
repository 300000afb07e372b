"""Differential test of graph breaks on real forwards: force a break at every statement
start of a model's forward, compile, and check the result equals eager. Resuming at an
arbitrary statement exercises value-stack rebuilding, NULLs, cells, loops, with-blocks and
exception tables on real code (nn layers, the GPT, HuggingFace models)."""
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


@pytest.mark.parametrize("name,code,offset", list(_cases()))
def test_forced_break_matches_eager(name, code, offset):
    tempa.reset()
    case = zoo.make(name)
    expected = run_eager(clone_case(case))
    interpreter.FORCED_BREAKS.add((code, offset))
    try:
        fast = tempa.compile(case.model, backend="eager")
        torch.manual_seed(case.seed)
        out = fast(*case.args, **case.kwargs)
    finally:
        interpreter.FORCED_BREAKS.discard((code, offset))
        tempa.reset()
    assert_same(out, expected, *case.tolerance)

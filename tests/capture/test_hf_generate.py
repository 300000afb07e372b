"""HuggingFace generation with a compiled forward (``model.forward = tempa.compile(...)``
then ``model.generate``), small GPT-2, Llama, Mistral and Qwen2 configs, greedy, 20 new
tokens: the tokens are eager's, and the cache objects' writes (DynamicLayer.keys =
torch.cat(...), the StaticCache's lazy initialisation) are captured as side effects, not
graph breaks. A second generate() makes a new cache object: it is guarded by class and its
tensors read by source (``kwargs['cache'].layers[0].keys``), so nothing is captured again.

torch.compile on the same code (torch 2.13 CPU, transformers 5): DynamicCache 3 graphs,
StaticCache under fullgraph 2 graphs, 0 breaks, nothing new on a second generate();
Mistral with its sliding window (DynamicSlidingWindowLayer) 3 graphs too."""
import pytest
import torch

import tempa

transformers = pytest.importorskip("transformers")


def _model(kind: str):
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                      n_positions=128, bos_token_id=0, eos_token_id=None)
        return transformers.GPT2LMHeadModel(cfg).eval()
    config = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
              "qwen2": transformers.Qwen2Config}[kind]
    # Mistral keeps its default sliding window (4096): DynamicSlidingWindowLayer's Python int
    # `cumulative_length` changes every decode step, and becomes a symbol after the first
    # change (automatic dynamic for ints), as torch.compile does.
    cfg = config(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                 max_position_embeddings=128, bos_token_id=0, eos_token_id=None)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def _counts():
    s = tempa.stats()
    return s.captures, s.graph_breaks, s.eager_fallbacks


@pytest.mark.parametrize("kind", ["gpt2", "llama", "mistral", "qwen2"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_matches_eager_in_few_graphs_without_breaks(kind, cache):
    model = _model(kind)
    ids = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=20, do_sample=False, pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        want = model.generate(ids, **kw)
    model.forward = tempa.compile(model.forward, fullgraph=cache == "static", backend="eager")
    with torch.no_grad():
        got = model.generate(ids, **kw)
    assert torch.equal(got, want)
    # prefill, the first decode step, the decode graph with a symbolic cache length
    # (StaticCache: prefill and decode), as torch.compile
    first = 3 if cache == "dynamic" else 2
    assert _counts() == (first, 0, 0)
    with torch.no_grad():
        again = model.generate(ids, **kw)
    assert torch.equal(again, want)
    assert _counts() == (first, 0, 0)   # the new cache object finds the same graphs

"""The model zoo: named, deterministic cases that every tempa test and benchmark uses.

    from tests.models import zoo
    case = zoo.make("hf_llama")          # a fresh, independent Case every call
    out = case.model(*case.args, **case.kwargs)

A case is built from a fixed seed inside `torch.random.fork_rng`, so building one never
disturbs the caller's RNG and two builds give bit-identical weights and inputs. Models are
small, fp32, on CPU, and in `eval()` unless the case is a training case (`case.train`).
HuggingFace models are built from tiny configs with random weights: nothing is downloaded.

Names are stable ids; tests and benchmark tables refer to them. The lists:

    SEEDS         the two seed examples (mlp_seed, graph_break_seed)
    NN_LAYERS     one case per common torch.nn layer
    GPT           the hand-written nanoGPT (explicit attention, SDPA, training with loss)
    HF            HuggingFace models, eager attention and `*_sdpa` variants, use_cache=False
    HF_CACHE      HF decoders called with use_cache=True (forward builds and returns a DynamicCache)
    TRANSFORMERS  GPT + HF + HF_CACHE
    ONE_GRAPH     every case a correct capturer takes as one graph with no break
    ALL           everything
    EAGER_IN_TRAINING  cases whose training variant tempa still runs eagerly, and why
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch
import torch.nn as nn

from . import gpt as gpt_mod


class Tolerance(NamedTuple):
    """rtol, atol for comparing a compiled run against eager in fp32: `assert_same(a, e, *case.tolerance)`."""
    rtol: float = 1e-5
    atol: float = 1e-5


EXACTISH = Tolerance(1e-5, 1e-5)     # a few ops; any reordering error is ~1 ulp
DEEP = Tolerance(1e-4, 1e-4)         # transformer stacks: matmul/softmax/layernorm reassociation adds up


@dataclass
class Case:
    model: nn.Module
    args: tuple
    kwargs: dict
    train: bool
    tolerance: Tolerance
    name: str = ""
    seed: int = 0               # run_eager seeds the RNG with it (dropout in training cases)
    graph_breaks: int = 0       # breaks a correct capture has (the graph_break_seed has 1)
    group: str = ""             # which list it belongs to (seeds, nn, gpt, hf, hf_cache)
    notes: str = ""

    def __call__(self, fn: Callable | None = None):
        """Run `fn` (default: the model) on the case's inputs."""
        return (self.model if fn is None else fn)(*self.args, **self.kwargs)


_FACTORIES: dict[str, tuple[str, Callable[[], Case]]] = {}


def _register(name: str, group: str):
    def deco(fn: Callable[[], Case]):
        assert name not in _FACTORIES, name
        _FACTORIES[name] = (group, fn)
        return fn
    return deco


def make(name: str) -> Case:
    """Build the case `name`: a fresh model and fresh inputs, deterministic."""
    try:
        group, factory = _FACTORIES[name]
    except KeyError:
        raise KeyError(f"unknown zoo case {name!r}; known: {', '.join(ALL)}") from None
    with torch.random.fork_rng(devices=[]):
        case = factory()
    case = dataclasses.replace(case, name=name, group=group)
    case.model.train(case.train)
    return case


def _randn(*shape, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


# ---------------------------------------------------------------- the seeds

class JaringanKecil(nn.Module):
    """shared/seeds/000_d0c2f6b7695a8fc8.txt, first example."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class JaringanPutus(nn.Module):
    """shared/seeds/000_d0c2f6b7695a8fc8.txt, second example: a branch on a tensor's value."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        y = torch.relu(self.fc1(x))
        if y.sum() > 0:  # cabang bergantung pada nilai tensor
            y = y * 1.0
        return self.fc2(y)


@_register("mlp_seed", "seeds")
def _mlp_seed():
    torch.manual_seed(42)  # exactly the seed's sequence: seed, model, then x
    model = JaringanKecil()
    x = torch.randn(8, 32)
    return Case(model, (x,), {}, False, EXACTISH)


@_register("graph_break_seed", "seeds")
def _graph_break_seed():
    torch.manual_seed(0)
    model = JaringanPutus()
    x = torch.randn(4, 32)
    return Case(model, (x,), {}, False, EXACTISH, graph_breaks=1,
                notes="`if y.sum() > 0` must break (2 graphs, 1 break) or be rewritten to torch.cond-like code")


# ---------------------------------------------------------------- common nn layers

@_register("linear", "nn")
def _linear():
    torch.manual_seed(0)
    return Case(nn.Linear(32, 16), (_randn(8, 32),), {}, False, EXACTISH)


@_register("conv1d", "nn")
def _conv1d():
    torch.manual_seed(0)
    return Case(nn.Conv1d(4, 8, kernel_size=3, padding=1), (_randn(2, 4, 16),), {}, False, EXACTISH)


@_register("conv2d", "nn")
def _conv2d():
    torch.manual_seed(0)
    return Case(nn.Conv2d(3, 8, kernel_size=3, stride=1, padding=1), (_randn(2, 3, 16, 16),), {}, False,
                EXACTISH)


@_register("batchnorm2d_train", "nn")
def _bn_train():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(8)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    x = _randn(4, 8, 6, 6) * 2.0 + 0.5  # non-trivial batch stats, so running-stat updates are visible
    return Case(bn, (x,), {}, True, EXACTISH,
                notes="mutates running_mean/running_var/num_batches_tracked: compare buffers too; use clone_case")


@_register("batchnorm2d_eval", "nn")
def _bn_eval():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(8)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    return Case(bn, (_randn(4, 8, 6, 6),), {}, False, EXACTISH)


@_register("layernorm", "nn")
def _layernorm():
    torch.manual_seed(0)
    ln = nn.LayerNorm(32)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.5, 0.5)
    return Case(ln, (_randn(4, 10, 32),), {}, False, EXACTISH)


@_register("groupnorm", "nn")
def _groupnorm():
    torch.manual_seed(0)
    gn = nn.GroupNorm(4, 16)
    with torch.no_grad():
        gn.weight.uniform_(0.5, 1.5)
        gn.bias.uniform_(-0.5, 0.5)
    return Case(gn, (_randn(2, 16, 8, 8),), {}, False, EXACTISH)


@_register("embedding", "nn")
def _embedding():
    torch.manual_seed(0)
    idx = torch.randint(0, 100, (4, 10), generator=torch.Generator().manual_seed(1))
    return Case(nn.Embedding(100, 16, padding_idx=0), (idx,), {}, False, EXACTISH)


@_register("dropout_eval", "nn")
def _dropout_eval():
    return Case(nn.Dropout(0.5), (_randn(8, 32),), {}, False, EXACTISH)


@_register("multihead_attention", "nn")
def _mha():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(embed_dim=32, num_heads=4, dropout=0.1, batch_first=True)
    x = _randn(2, 10, 32)
    # self-attention as users call it; returns (attn_output, averaged attn_weights)
    return Case(mha, (x, x, x), {}, False, EXACTISH)


@_register("transformer_encoder_layer", "nn")
def _tel():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.1,
                                       batch_first=True)
    return Case(layer, (_randn(2, 10, 32),), {}, False, EXACTISH,
                notes="under no_grad in eval, eager takes the fused fast path (torch._transformer_encoder_layer_fwd)")


# ---------------------------------------------------------------- hand-written GPT

def _gpt_tokens(cfg, B=2, T=16, seed=1):
    return torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


@_register("gpt", "gpt")
def _gpt():
    torch.manual_seed(0)
    cfg = gpt_mod.small_config()
    return Case(gpt_mod.GPT(cfg), (_gpt_tokens(cfg),), {}, False, DEEP)


@_register("gpt_sdpa", "gpt")
def _gpt_sdpa():
    torch.manual_seed(0)
    cfg = gpt_mod.small_config(sdpa=True)
    return Case(gpt_mod.GPT(cfg), (_gpt_tokens(cfg),), {}, False, DEEP)


@_register("gpt_train", "gpt")
def _gpt_train():
    """Training mode with targets -> (logits, loss). dropout=0 so eager and compiled agree
    without sharing RNG streams; use it for backward and short SGD runs."""
    torch.manual_seed(0)
    cfg = gpt_mod.small_config(dropout=0.0)
    idx = _gpt_tokens(cfg, seed=1)
    targets = _gpt_tokens(cfg, seed=2)
    return Case(gpt_mod.GPT(cfg), (idx,), {"targets": targets}, True, DEEP)


# ---------------------------------------------------------------- HuggingFace transformers

_HF_B, _HF_T, _HF_VOCAB = 2, 12, 100


def _hf_text_inputs(with_token_type: bool = False) -> dict:
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, _HF_VOCAB, (_HF_B, _HF_T), generator=g)
    # Row 1 is right-padded by 3 tokens: real batches have padding, and it makes the
    # attention_mask matter (all-ones masks let HF skip the mask entirely in eager mode).
    attention_mask = torch.ones(_HF_B, _HF_T, dtype=torch.long)
    attention_mask[1, -3:] = 0
    input_ids[1, -3:] = 0
    kw = {"input_ids": input_ids, "attention_mask": attention_mask}
    if with_token_type:
        tt = torch.zeros(_HF_B, _HF_T, dtype=torch.long)
        tt[:, _HF_T // 2:] = 1
        kw["token_type_ids"] = tt
    return kw


def _hf_build(model_cls_name: str, config_cls_name: str, attn: str, **config_kwargs):
    import transformers
    config_cls = getattr(transformers, config_cls_name)
    model_cls = getattr(transformers, model_cls_name)
    config = config_cls(attn_implementation=attn, return_dict=True, **config_kwargs)
    torch.manual_seed(0)
    model = model_cls(config)
    assert model.config._attn_implementation == attn, (model_cls_name, model.config._attn_implementation)
    return model


def _bert(attn):
    model = _hf_build("BertModel", "BertConfig", attn, vocab_size=_HF_VOCAB, hidden_size=32,
                      num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      max_position_embeddings=64, type_vocab_size=2)
    return Case(model, (), _hf_text_inputs(with_token_type=True), False, DEEP)


def _gpt2(attn, use_cache=False):
    model = _hf_build("GPT2LMHeadModel", "GPT2Config", attn, vocab_size=_HF_VOCAB, n_embd=32, n_layer=2,
                      n_head=4, n_positions=64, use_cache=use_cache, bos_token_id=1, eos_token_id=2)
    return Case(model, (), _hf_text_inputs(), False, DEEP)


def _llama(attn, use_cache=False):
    model = _hf_build("LlamaForCausalLM", "LlamaConfig", attn, vocab_size=_HF_VOCAB, hidden_size=64,
                      intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, use_cache=use_cache,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return Case(model, (), _hf_text_inputs(), False, DEEP)


def _t5_encoder(attn):
    model = _hf_build("T5EncoderModel", "T5Config", attn, vocab_size=_HF_VOCAB, d_model=32, d_kv=8,
                      d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
                      relative_attention_max_distance=16, use_cache=False)
    return Case(model, (), _hf_text_inputs(), False, DEEP)


def _vit(attn):
    model = _hf_build("ViTModel", "ViTConfig", attn, image_size=32, patch_size=8, num_channels=3,
                      hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    return Case(model, (), {"pixel_values": _randn(2, 3, 32, 32)}, False, DEEP)


for _attn in ("eager", "sdpa"):
    _sfx = "" if _attn == "eager" else "_sdpa"
    _register(f"hf_bert{_sfx}", "hf")(lambda a=_attn: _bert(a))
    _register(f"hf_gpt2{_sfx}", "hf")(lambda a=_attn: _gpt2(a))
    _register(f"hf_llama{_sfx}", "hf")(lambda a=_attn: _llama(a))
    _register(f"hf_t5_encoder{_sfx}", "hf")(lambda a=_attn: _t5_encoder(a))
    _register(f"hf_vit{_sfx}", "hf")(lambda a=_attn: _vit(a))

# Decoders as users call them for generation-style forwards: forward creates a DynamicCache,
# fills it layer by layer and returns it in the output (past_key_values).
_register("hf_gpt2_cache", "hf_cache")(lambda: _gpt2("sdpa", use_cache=True))
_register("hf_llama_cache", "hf_cache")(lambda: _llama("sdpa", use_cache=True))
del _attn, _sfx


# ---------------------------------------------------------------- the lists

def _names(group: str) -> list[str]:
    return [n for n, (g, _) in _FACTORIES.items() if g == group]


SEEDS = _names("seeds")
NN_LAYERS = _names("nn")
GPT = _names("gpt")
HF = _names("hf")
HF_EAGER = [n for n in HF if not n.endswith("_sdpa")]
HF_SDPA = [n for n in HF if n.endswith("_sdpa")]
HF_CACHE = _names("hf_cache")
TRANSFORMERS = GPT + HF + HF_CACHE
ALL = list(_FACTORIES)
ONE_GRAPH = [n for n in ALL if n != "graph_break_seed"]

# Cases whose training variant tempa's backend still runs eagerly (said in explain and in
# tempa_info.fallback_reason), with the reason. None now: GroupNorm's (its decomposition's
# derivative wrote a copy_ into the backward) is differentiated through its own derivative.
EAGER_IN_TRAINING: dict = {}
TRAIN = ["batchnorm2d_train", "gpt_train"]

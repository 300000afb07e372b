"""More HuggingFace architectures than the zoo, each one graph and equal to eager: a guard
against capture gaps in code paths the zoo does not take (copy.copy of configs, delattr on
fresh objects, windowed attention, convolutional stems, encoder-decoder)."""
import warnings

import pytest
import torch
import transformers as T

import tempa
from tests.models.compare import assert_same

warnings.filterwarnings("ignore")
SMALL = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64)
TEXT = {"input_ids": torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(0)),
        "attention_mask": torch.tensor([[1] * 10, [1] * 7 + [0] * 3])}
PIXELS = {"pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))}

CASES = {
    "mistral": (T.MistralConfig, T.MistralForCausalLM, TEXT, dict(num_key_value_heads=2, **SMALL)),
    "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM, TEXT, dict(num_key_value_heads=2, **SMALL)),
    "gemma": (T.GemmaConfig, T.GemmaForCausalLM, TEXT, dict(num_key_value_heads=2, head_dim=8, **SMALL)),
    "phi": (T.PhiConfig, T.PhiForCausalLM, TEXT, SMALL),
    "roberta": (T.RobertaConfig, T.RobertaModel, TEXT, SMALL),
    "distilbert": (T.DistilBertConfig, T.DistilBertModel, TEXT,
                   dict(vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64)),
    "convnext": (T.ConvNextConfig, T.ConvNextModel, PIXELS,
                 dict(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1])),
    "swin": (T.SwinConfig, T.SwinModel, PIXELS,
             dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4],
                  window_size=4)),
    "clip_vision": (T.CLIPVisionConfig, T.CLIPVisionModel, PIXELS,
                    dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, image_size=32, patch_size=8)),
    "bart": (T.BartConfig, T.BartModel,
             {"input_ids": torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(1)),
              "decoder_input_ids": torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(2))},
             dict(vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1,
                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                  decoder_ffn_dim=64)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hf_architecture_is_one_graph(name):
    tempa.reset()
    config_cls, model_cls, inputs, kwargs = CASES[name]
    config = config_cls(**kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = model_cls(config).eval()
    expected = model(**inputs)
    fast = tempa.compile(model, backend="eager", fullgraph=True)
    assert_same(fast(**inputs), expected, 1e-4, 1e-4)
    assert tempa.stats().captures == 1

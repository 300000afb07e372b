"""Real-size models from Hugging Face ``transformers`` configs (random weights, nothing
downloaded), shared by the CPU (real_models.py) and GPU (gpu_real.py) benchmarks.

    from hf_models import build, NAMES
    case = build("resnet", size="default", train=False)   # a Case: model + inputs

Sizes:
  quick    fewer layers, the smallest inputs below (a run on a loaded 2-core machine)
  default  the sizes of issue 18: batch 1-2, 128x128 images, 64-500 tokens
  larger   the architectures' real depths, 224x224 images, longer sequences

Every dropout / drop-path probability in a config is set to 0, so that a training step is
deterministic and the compiled result can be compared with eager's. Models are in train()
mode for a training step (BatchNorm uses batch statistics) and eval() for inference.
Importing this module does not import transformers; ``available()`` says whether it is there.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

import torch

VISION = ("resnet", "convnext", "mobilenet_v2", "efficientnet", "swin", "vit")
TEXT = ("bert", "distilbert", "gpt2", "llama", "mistral", "qwen2", "t5", "whisper_encoder")
NAMES = VISION + TEXT
DECODERS = ("gpt2", "llama", "mistral", "qwen2")    # causal LMs: prefill / decode rows


def available() -> bool:
    return importlib.util.find_spec("transformers") is not None


@dataclass
class Case:
    name: str
    title: str                      # what it is, with its size, for tables
    model: torch.nn.Module
    kwargs: dict                    # the forward's keyword inputs
    train: bool
    params_m: float = 0.0           # millions of parameters
    config: object = None
    notes: list = field(default_factory=list)

    def to(self, device):
        self.model.to(device)
        self.kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                       for k, v in self.kwargs.items()}
        return self


def loss_of(out) -> torch.Tensor:
    """The scalar a training step differentiates: the model's own loss when it computed one
    (labels were passed), else the mean square of its first output."""
    if isinstance(out, torch.Tensor) and out.dim() == 0:
        return out                   # the model returns its loss
    loss = getattr(out, "loss", None)
    if loss is not None:
        return loss
    return first_tensor(out).float().square().mean()


def first_tensor(out):
    """The first tensor of a model's output (a tensor, a ModelOutput, a dict or an object
    with ``values()``, lists and tuples of those), or None; also models.py's."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, dict) or hasattr(out, "values"):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        for o in out:
            t = first_tensor(o)
            if t is not None:
                return t
    return None


def _no_dropout(cfg):
    """Every float config field about dropout or drop-path (their names differ per model)."""
    for k, v in list(cfg.to_dict().items()):
        if ("drop" in k) and isinstance(v, float):
            setattr(cfg, k, 0.0)
    return cfg


# --- sizes ----------------------------------------------------------------------------------
# (batch, image side) for vision; (batch, tokens) for text; layers for transformers
_SIZES = {
    "quick":   dict(batch=1, image=128, tokens=64, layers=2, whisper_frames=250, dec_tokens=16),
    "default": dict(batch=2, image=128, tokens=128, layers=6, whisper_frames=500, dec_tokens=32),
    "larger":  dict(batch=4, image=224, tokens=512, layers=12, whisper_frames=1500, dec_tokens=128),
}


def _layers(size, full):
    """Transformer depth: the architecture's own (``full``) at "larger", fewer below."""
    return full if size == "larger" else min(full, _SIZES[size]["layers"])


def _stages(size, full):
    """ConvNet stage depths: the architecture's own at "default"/"larger", one block per
    stage at "quick"."""
    return [1] * len(full) if size == "quick" else list(full)


# --- vision ---------------------------------------------------------------------------------
def _vision(name, size, s):
    import transformers as T
    img = s["image"]
    if name == "resnet":      # ResNet-18-like (basic blocks) below "larger", ResNet-50 there
        if size == "larger":
            cfg = T.ResNetConfig()
            title = "ResNet-50"
        else:
            cfg = T.ResNetConfig(depths=_stages(size, [2, 2, 2, 2]), hidden_sizes=[64, 128, 256, 512],
                                 layer_type="basic")
            title = "ResNet-18-like"
        model = T.ResNetForImageClassification(_no_dropout(cfg))
    elif name == "convnext":
        cfg = T.ConvNextConfig(depths=_stages(size, [3, 3, 9, 3]), image_size=img)
        model, title = T.ConvNextForImageClassification(_no_dropout(cfg)), "ConvNeXt-T"
    elif name == "mobilenet_v2":
        cfg = T.MobileNetV2Config(image_size=img)
        model, title = T.MobileNetV2ForImageClassification(_no_dropout(cfg)), "MobileNetV2-1.0"
    elif name == "efficientnet":
        # B0's coefficients (the config's defaults are B7's)
        cfg = T.EfficientNetConfig(width_coefficient=1.0, depth_coefficient=1.0, image_size=img,
                                   hidden_dim=1280)
        model, title = T.EfficientNetForImageClassification(_no_dropout(cfg)), "EfficientNet-B0"
    elif name == "swin":
        # window 7 at 224 (56, 28, 14, 7 patches a side); 4 at 128 (32, 16, 8, 4), where 7
        # does not divide the stages and HF's shifted-window mask breaks
        cfg = T.SwinConfig(image_size=img, depths=_stages(size, [2, 2, 6, 2]),
                           window_size=7 if img % 224 == 0 else 4)
        model, title = T.SwinForImageClassification(_no_dropout(cfg)), "Swin-T"
    elif name == "vit":
        cfg = T.ViTConfig(image_size=img, num_hidden_layers=_layers(size, 12))
        model, title = T.ViTForImageClassification(_no_dropout(cfg)), f"ViT-B/16 {cfg.num_hidden_layers}L"
    else:
        raise KeyError(name)
    kwargs = {"pixel_values": torch.randn(s["batch"], 3, img, img)}
    return model, cfg, kwargs, f"{title} b{s['batch']} {img}x{img}"


def _calibrate_batchnorm(model, kwargs):
    """Unit scales and running statistics from one forward pass on the inputs, as a trained
    net would have. Why: with freshly initialised statistics (mean 0, variance 1), HF's small
    initial weights (EfficientNet's BatchNorm scales too) shrink the activations layer by
    layer until the logits are ~1e-22 to 1e-36: denormal floats, which the CPU computes far
    slower, and outputs too small for a comparison with eager to mean anything."""
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    momenta = [bn.momentum for bn in bns]
    for bn in bns:
        bn.reset_parameters()        # running stats, and scale 1 / shift 0
        bn.momentum = None           # a cumulative average: after one pass, that pass's stats
    model.train()
    with torch.no_grad():
        model(**kwargs)
    for bn, m in zip(bns, momenta):
        bn.momentum = m


def _vision_labels(cfg, batch):
    return torch.randint(0, cfg.num_labels, (batch,))


# --- text -----------------------------------------------------------------------------------
def _decoder_config(name, size):
    """Llama/Mistral/Qwen2-style decoders (GQA, RoPE, RMSNorm, SwiGLU) at ~100M parameters
    below "larger" (d=768, 12 heads over 4 K/V heads, vocab 32000), ~0.5B at "larger"."""
    import transformers as T
    big = size == "larger"
    common = dict(hidden_size=1024 if big else 768, intermediate_size=2816 if big else 2048,
                  num_hidden_layers=_layers(size, 16), num_attention_heads=16 if big else 12,
                  num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
    cls = {"llama": T.LlamaConfig, "mistral": T.MistralConfig, "qwen2": T.Qwen2Config}[name]
    extra = {"sliding_window": 4096} if name == "mistral" else {}
    return cls(**common, **extra)


def _text(name, size, s):
    import transformers as T
    B, L = s["batch"], s["tokens"]
    if name == "bert":
        cfg = T.BertConfig(num_hidden_layers=_layers(size, 12))
        model, title = T.BertForSequenceClassification(_no_dropout(cfg)), "BERT-base"
    elif name == "distilbert":
        cfg = T.DistilBertConfig(n_layers=_layers(size, 6))
        L = min(2 * L, 512)
        model, title = T.DistilBertForSequenceClassification(_no_dropout(cfg)), "DistilBERT"
    elif name == "gpt2":
        cfg = T.GPT2Config(n_layer=_layers(size, 12))
        model, title = T.GPT2LMHeadModel(_no_dropout(cfg)), "GPT-2 124M"
    elif name in ("llama", "mistral", "qwen2"):
        cfg = _decoder_config(name, size)
        cls = {"llama": T.LlamaForCausalLM, "mistral": T.MistralForCausalLM,
               "qwen2": T.Qwen2ForCausalLM}[name]
        model, title = cls(_no_dropout(cfg)), f"{name.capitalize()}-style"
    elif name == "t5":        # T5-small, encoder-decoder forward (decoder inputs shorter)
        cfg = T.T5Config(num_layers=_layers(size, 6), num_decoder_layers=_layers(size, 6))
        model, title = T.T5ForConditionalGeneration(_no_dropout(cfg)), "T5-small"
        D = s["dec_tokens"]
        kwargs = {"input_ids": torch.randint(0, cfg.vocab_size, (B, L)),
                  "decoder_input_ids": torch.randint(0, cfg.vocab_size, (B, D))}
        return model, cfg, kwargs, f"{title} {cfg.num_layers}L b{B} enc T{L} dec T{D}"
    elif name == "whisper_encoder":   # Whisper-base's encoder; max_source_positions = frames
        frames = s["whisper_frames"]
        cfg = T.WhisperConfig(d_model=512, encoder_layers=_layers(size, 6), encoder_attention_heads=8,
                              encoder_ffn_dim=2048, max_source_positions=frames)
        from transformers.models.whisper.modeling_whisper import WhisperEncoder
        model = WhisperEncoder(_no_dropout(cfg))
        kwargs = {"input_features": torch.randn(1, cfg.num_mel_bins, 2 * frames)}
        return model, cfg, kwargs, f"Whisper-base encoder {cfg.encoder_layers}L b1 T{frames}"
    else:
        raise KeyError(name)
    layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layers", None)
    kwargs = {"input_ids": torch.randint(0, cfg.vocab_size, (B, L))}
    return model, cfg, kwargs, f"{title} {layers}L b{B} T{L}"


def _labels(name, cfg, kwargs):
    """Labels for a training step, so that the model computes its own loss."""
    if name in VISION:
        return {"labels": _vision_labels(cfg, kwargs["pixel_values"].shape[0])}
    if name in ("bert", "distilbert"):
        return {"labels": torch.randint(0, cfg.num_labels, (kwargs["input_ids"].shape[0],))}
    if name in DECODERS:
        return {"labels": kwargs["input_ids"].clone()}
    if name == "t5":
        return {"labels": kwargs["decoder_input_ids"].clone()}
    return {}                 # the Whisper encoder has no head: loss_of squares its output


def build(name: str, size: str = "default", train: bool = False, seed: int = 0,
          **inputs) -> Case:
    """One model with random weights (seeded) and its inputs, on the CPU, fp32. ``inputs``
    overrides the size's input shapes: ``batch``, ``image``, ``tokens``, ``dec_tokens``,
    ``whisper_frames`` (the GPU benchmark's larger batches)."""
    unknown = set(inputs) - set(_SIZES[size])
    if unknown:
        raise TypeError(f"hf_models.build: unknown input sizes {sorted(unknown)}")
    torch.manual_seed(seed)
    s = {**_SIZES[size], **inputs}
    model, cfg, kwargs, title = (_vision if name in VISION else _text)(name, size, s)
    if name in VISION:
        _calibrate_batchnorm(model, kwargs)
    if train:
        kwargs.update(_labels(name, cfg, kwargs))
        model.train()
    else:
        model.eval()
    params = sum(p.numel() for p in model.parameters()) / 1e6
    return Case(name, f"{title} ({params:.0f}M)", model, kwargs, train, params, cfg)

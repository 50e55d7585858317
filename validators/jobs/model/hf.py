"""Building the model: a small random config of a registered architecture, or a local checkpoint.

Oracle: none (construction).  transformers is optional (``pip install replayssm[model]``): without
it :func:`require` raises :class:`EnvironmentProblem` (one line, exit 3).  Nothing here reaches the
network: a random model is built from its config class, a checkpoint with ``local_files_only``.

Architectures (:data:`ARCHITECTURES`): ``qwen3_next`` (Gated DeltaNet layers between full-attention
layers; its dense MLP on every layer, ``mlp_only_layers``: transformers' grouped MoE matmul refuses
fp64), ``qwen3_5`` (Qwen3.5's text model: the same pattern, its GDN layer with separate in-projections,
dense MLPs), ``nemotron_h`` (Mamba-2 mixers, an attention and an MLP layer) and ``kimi_linear`` (KDA layers
around an MLA attention layer, dense MLPs for the same reason), at ``tiny`` (CPU tests) or ``real``
(Qwen3.5-4B's GDN / Nemotron-3-Nano-4B's Mamba-2 / Kimi-Linear-48B's KDA head shapes, few layers) sizes.

A checkpoint is matched by its ``model_type`` (:data:`MODEL_TYPES`): Qwen3.5's is ``qwen3_5_text`` for
the text model and ``qwen3_5`` for the multimodal wrapper (``Qwen3_5ForConditionalGeneration``), whose
text part transformers' ``AutoModelForCausalLM`` loads as ``Qwen3_5ForCausalLM`` (the
``model.language_model.`` prefix mapped to ``model.``, the vision tower and any MTP weights not loaded).

The random weights are drawn with ``initializer_range`` 0.2 (not the config's 0.02, under which every
layer's contribution to the residual stream is a rounding error) and the LM head is then scaled so
the teacher's mean next-token entropy is ``entropy_fraction`` of ln(vocab) (:func:`calibrate_head`;
a near-uniform distribution would hide any change): how, and the entropy, go in the report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from replayssm.guard import EnvironmentProblem

try:
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache
except ImportError:  # the optional extra is not installed
    transformers = None

TRANSFORMERS_SPEC = "transformers>=5.23,<6"
INIT_RANGE = 0.2


@dataclass(frozen=True)
class Architecture:
    name: str
    family: str
    config_class: str
    layer_class: str
    sizes: dict
    model_types: tuple = ()  # the checkpoint model_types it loads (default: its name)

    def config(self, size: str, seed: int):
        if size not in self.sizes:
            raise ValueError(f"size: expected one of {sorted(self.sizes)} for {self.name}, got {size!r}")
        kw = dict(self.sizes[size])
        cls = getattr(transformers, self.config_class)
        n = len(kw["layer_types"])
        return cls(num_hidden_layers=n, initializer_range=INIT_RANGE, attn_implementation="eager", **kw)


# One attention layer between GDN layers: every GDN layer after it reads hidden states that depend
# on the attention cache (what a rollback through a scratch cache gets wrong, rMLX #436).
_QWEN3_NEXT_TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2,
                        linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
                        mlp_only_layers=[0, 1, 2, 3])
# Qwen3.5-4B's GDN layer (16 key / 32 value heads of 128 x 128, d_conv 4) and hidden size, 4 layers.
_QWEN3_NEXT_REAL = dict(vocab_size=4096, hidden_size=2560, intermediate_size=4096, num_attention_heads=16,
                        num_key_value_heads=4, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32,
                        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
                        mlp_only_layers=[0, 1, 2, 3])
# Qwen3.5's text model: the qwen3_next pattern and shapes; its MLP is dense on every layer by construction.
_QWEN3_5_TINY = {k: v for k, v in _QWEN3_NEXT_TINY.items() if k != "mlp_only_layers"}
_QWEN3_5_REAL = {k: v for k, v in _QWEN3_NEXT_REAL.items() if k != "mlp_only_layers"}
# Nemotron-H's pattern (Mamba-2, attention, Mamba-2, MLP, Mamba-2): the attention layer again before two
# of the three mixers.  Δ's initial range is widened from Mamba-2's [1e-3, 1e-1] to [1e-2, 1] so the
# state, not only the D x skip, carries the mixer's output at 64 positions (decays exp(A Δ) down to e^-4).
_NEMOTRON_H_LAYERS = ["linear_attention", "full_attention", "linear_attention", "mlp", "linear_attention"]
_NEMOTRON_H_TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=16, mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=16,
                        n_groups=2, conv_kernel=4, time_step_min=0.01, time_step_max=1.0,
                        layer_types=_NEMOTRON_H_LAYERS)
# Nemotron-3-Nano-4B's Mamba-2 layer (the nano4b preset: 96 heads x 80, dstate 128, 8 groups, d_conv 4)
# and hidden size, 5 layers.
_NEMOTRON_H_REAL = dict(vocab_size=4096, hidden_size=3072, intermediate_size=4096, num_attention_heads=32,
                        num_key_value_heads=8, head_dim=128, mamba_num_heads=96, mamba_head_dim=80,
                        ssm_state_size=128, n_groups=8, conv_kernel=4, time_step_min=0.01, time_step_max=1.0,
                        layer_types=_NEMOTRON_H_LAYERS)

# Kimi-Linear's pattern (KDA, MLA attention, KDA, KDA): transformers' hybrid cache of kimi_linear needs an
# attention layer in the layer list, and the KDA layers after it read hidden states that depend on its
# cache.  A dense MLP on every layer (``mlp_layer_types``): the MoE's grouped matmul refuses fp64.  The
# token ids the config names (its defaults lie beyond a small vocabulary) are set inside it.
_KIMI_LAYERS = ["linear_attention", "full_attention", "linear_attention", "linear_attention"]
_KIMI_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
_KIMI_LINEAR_TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                         num_key_value_heads=2, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
                         qk_nope_head_dim=8, v_head_dim=8, linear_num_heads=2, linear_head_dim=16,
                         linear_conv_kernel_dim=4, layer_types=_KIMI_LAYERS, mlp_layer_types=["dense"] * 4,
                         **_KIMI_IDS)
# Kimi-Linear-48B-A3B's KDA layer (32 heads of 128 x 128, short conv 4; the kimi-linear-48b preset) and
# its MLA attention (32 heads, kv_lora_rank 512, rope 64, nope 128, v 128) and hidden size, 4 layers.
_KIMI_LINEAR_REAL = dict(vocab_size=4096, hidden_size=2304, intermediate_size=4096, num_attention_heads=32,
                         num_key_value_heads=32, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
                         qk_nope_head_dim=128, v_head_dim=128, linear_num_heads=32, linear_head_dim=128,
                         linear_conv_kernel_dim=4, layer_types=_KIMI_LAYERS, mlp_layer_types=["dense"] * 4,
                         **_KIMI_IDS)

ARCHITECTURES = {
    "qwen3_next": Architecture("qwen3_next", "gdn", "Qwen3NextConfig", "Qwen3NextGatedDeltaNet",
                               {"tiny": _QWEN3_NEXT_TINY, "real": _QWEN3_NEXT_REAL}),
    "qwen3_5": Architecture("qwen3_5", "gdn", "Qwen3_5TextConfig", "Qwen3_5GatedDeltaNet",
                            {"tiny": _QWEN3_5_TINY, "real": _QWEN3_5_REAL}, ("qwen3_5_text", "qwen3_5")),
    "nemotron_h": Architecture("nemotron_h", "mamba2", "NemotronHConfig", "NemotronHMamba2Mixer",
                               {"tiny": _NEMOTRON_H_TINY, "real": _NEMOTRON_H_REAL}),
    "kimi_linear": Architecture("kimi_linear", "kda", "KimiLinearConfig", "KimiLinearDeltaAttention",
                                {"tiny": _KIMI_LINEAR_TINY, "real": _KIMI_LINEAR_REAL}),
}
# A checkpoint's config model_type -> its architecture.
MODEL_TYPES = {t: a for a in ARCHITECTURES.values() for t in (a.model_types or (a.name,))}
# The architecture a family runs on when only ``--family`` is given.
FAMILY_ARCH = {"gdn": "qwen3_next", "mamba2": "nemotron_h", "kda": "kimi_linear"}


def available() -> bool:
    return transformers is not None


def require() -> None:
    """EnvironmentProblem (exit 3) naming the extra when transformers is not installed."""
    if transformers is None:
        raise EnvironmentProblem(f"replayssm model needs transformers ({TRANSFORMERS_SPEC}): "
                                 f"pip install 'replayssm[model]'")


def architecture(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise ValueError(f"arch: expected one of {sorted(ARCHITECTURES)}, got {name!r}")
    return ARCHITECTURES[name]


def build_random(arch: str, size: str, seed: int, dtype: torch.dtype = torch.float64):
    """A random model of ``arch`` at ``size`` (weights from ``seed``), in ``dtype``, eval mode."""
    require()
    a = architecture(arch)
    cfg = a.config(size, seed)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    return model.to(dtype).eval(), a


def load_local(path: str | Path, dtype: torch.dtype = torch.float64):
    """The checkpoint in directory ``path`` (no network); ValueError naming ``--weights`` when it is
    missing, not a checkpoint, or of an architecture without an adapter."""
    require()
    p = Path(path)
    if not p.is_dir():
        raise ValueError(f"--weights: {path} is not a directory")
    if not (p / "config.json").is_file():
        raise ValueError(f"--weights: {path} has no config.json (expected a directory written by save_pretrained)")
    try:
        cfg = AutoConfig.from_pretrained(p, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable config is one line
        raise ValueError(f"--weights: {path}: config.json unreadable: {' '.join(str(e).split())[:200]}") from e
    mt = getattr(cfg, "model_type", None)
    if mt not in MODEL_TYPES:
        raise ValueError(f"--weights: {path} holds a {mt!r} model; expected a model_type from {sorted(MODEL_TYPES)}")
    try:
        model = AutoModelForCausalLM.from_pretrained(p, local_files_only=True, dtype=dtype,
                                                     attn_implementation="eager")
    except Exception as e:  # noqa: BLE001 - a checkpoint that does not load is one line
        raise ValueError(f"--weights: {path}: the checkpoint does not load: {' '.join(str(e).split())[:200]}") from e
    return model.eval(), MODEL_TYPES[mt]


def new_cache(model):
    """An empty KV cache of ``model`` (its attention layers; the mixers keep their own state)."""
    return DynamicCache(config=model.config)


def mean_entropy(logits: torch.Tensor) -> float:
    lp = torch.log_softmax(logits.to(torch.float64), dim=-1)
    return float(-(lp.exp() * lp).sum(-1).mean())


def calibrate_head(model, hidden: torch.Tensor, fraction: float) -> tuple[float, float]:
    """Scale the LM head's weight so the mean entropy of ``lm_head(hidden)`` is ``fraction`` x
    ln(vocab) (bisection on the scale, monotone); returns ``(scale, entropy)``."""
    if not 0 < fraction < 1:
        raise ValueError(f"entropy_fraction: expected a number in (0, 1), got {fraction!r}")
    head = model.get_output_embeddings()
    with torch.no_grad():
        base = head(hidden)
        target = fraction * math.log(base.shape[-1])
        lo, hi = 1e-3, 1e3
        for _ in range(60):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if mean_entropy(base * mid) > target else (lo, mid)
        s = math.sqrt(lo * hi)
        head.weight.mul_(s)
        if getattr(head, "bias", None) is not None:
            head.bias.mul_(s)
    return s, mean_entropy(base * s)

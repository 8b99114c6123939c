"""Tiny DeepSeek-V4.1 checkpoints and golden logits from the transformers reference.

transformers on PyPI (5.24.0) does not ship `deepseek_v41`, so the reference modeling and
configuration files of huggingface/transformers (`src/transformers/models/deepseek_v41/`)
are run from a directory OUTSIDE this repository, given on the command line; this script
fetches nothing and its output holds none of their code. It registers that directory as the
package `transformers.models.deepseek_v41` of the installed transformers, builds a few tiny
random V4.1 models, writes each as a checkpoint in the released layout (tensor names as
released: the transformers names without `model.`, `lm_head` -> `head`), and the golden
fp32 tensors the C++ forward pass is compared against.

    tools/.venv-model/bin/python tools/model_golden.py --oracle /work/oracle/deepseek_v41 \
        --out tests/kernels/golden/model

Deterministic (fixed seeds). See tests/kernels/golden/model/README.md for what is written.
"""
import argparse
import hashlib
import importlib.util
import json
import pathlib
import sys
import types

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

REPO = pathlib.Path(__file__).resolve().parent.parent
ORACLE_SHA256 = {}


# ---------------------------------------------------------------------------------------
# the stability probe (tests/kernels/model_fixture.hpp, probe_stability)

PROBE_JITTER = 1e-6
# Inputs are chosen under a jitter this many times stronger, over more seeds, than the tests
# check them with: a decision that sits just outside the selection's reach would still flip
# now and then under the check's draws on some BLAS kernel.
SELECT_JITTER = 4 * PROBE_JITTER
SELECT_SEEDS = (11, 12, 13, 14, 15, 16)
SELECT_BOUND = 5e-5  # the jitter alone moves the logits ~1e-5 here; one flipped FP8 element ~1e-3


class jitter_linears:
    """While active, every nn.Linear output element y of `module` gets
    y += PROBE_JITTER * u * rms(its row), u uniform in [-1, 1) from a generator seeded with
    `seed`: a stand-in for another BLAS kernel's summation order, as model_options::jitter does
    in the C++. An input whose outputs move by much more than the jitter under it sits on a
    decision boundary (an FP8/FP4 rounding step, a router or indexer top-k, an argmax), where
    two correct implementations may disagree; the goldens avoid such inputs."""

    def __init__(self, module, seed, jitter=PROBE_JITTER):
        self.module, self.seed, self.jitter, self.hooks = module, seed, jitter, []

    def __enter__(self):
        gen = torch.Generator().manual_seed(self.seed)

        def hook(_m, _args, out):
            rms = out.float().pow(2).mean(-1, keepdim=True).sqrt()
            u = torch.rand(out.shape, generator=gen, dtype=torch.float64).to(out.dtype) * 2 - 1
            return out + self.jitter * u * rms.to(out.dtype)

        for m in self.module.modules():
            if isinstance(m, torch.nn.Linear):
                self.hooks.append(m.register_forward_hook(hook))
        return self

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()


def relative_change(a, b):
    """max |a - b| / max |b|, as the C++ tests' relative_error."""
    a, b = a.double().flatten(), b.double().flatten()
    scale = b.abs().max().item()
    diff = (a - b).abs().max().item()
    return diff / scale if scale > 0 else diff


def probe(module, compute, seeds=SELECT_SEEDS, jitter=SELECT_JITTER):
    """compute() -> (floats tensor, exact list). Returns (worst relative change of the floats
    under the jitter, whether an exact output changed)."""
    values, exact = compute()
    worst, changed = 0.0, False
    for seed in seeds:
        with jitter_linears(module, seed, jitter):
            v, e = compute()
        worst = max(worst, relative_change(v, values))
        changed = changed or e != exact
    return worst, changed


# ---------------------------------------------------------------------------------------
# loading the reference


def load_oracle(oracle_dir: pathlib.Path):
    """Imports configuration_deepseek_v41.py and modeling_deepseek_v41.py from oracle_dir as
    transformers.models.deepseek_v41.*, so their relative imports resolve against the
    installed transformers. Returns (configuration module, modeling module)."""
    for name in ("configuration_deepseek_v41.py", "modeling_deepseek_v41.py"):
        if not (oracle_dir / name).is_file():
            sys.exit(f"{oracle_dir / name}: missing (the upstream reference file is expected there)")
    package = "transformers.models.deepseek_v41"
    pkg = types.ModuleType(package)
    pkg.__path__ = [str(oracle_dir)]
    pkg.__package__ = package
    sys.modules[package] = pkg
    modules = []
    for stem in ("configuration_deepseek_v41", "modeling_deepseek_v41"):
        spec = importlib.util.spec_from_file_location(f"{package}.{stem}", oracle_dir / f"{stem}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        setattr(pkg, stem, module)
        modules.append(module)
    install_cache_shim()
    return modules


def install_cache_shim():
    """transformers 5.24's cache_utils.get_layer_types_and_kwargs passes the layer config only
    to the V4 compressed layer types; the V4.1 reference's cache layer for
    `shared_compressed_attention` takes it too (upstream main passes it). Wrap the function so
    DynamicCache(config=...) can build that layer. Nothing else is patched."""
    from transformers import cache_utils

    original = cache_utils.get_layer_types_and_kwargs

    def patched(config):
        layer_types, per_layer_kwargs = original(config)
        layer_configs = config.per_layer_config
        for i, layer_type in enumerate(layer_types):
            if layer_type == "shared_compressed_attention" and "config" not in per_layer_kwargs[i]:
                per_layer_kwargs[i] = dict(per_layer_kwargs[i], config=layer_configs[i])
        return layer_types, per_layer_kwargs

    cache_utils.get_layer_types_and_kwargs = patched


# ---------------------------------------------------------------------------------------
# the tiny configurations

VOCAB = 64


def base_text_config(**overrides):
    text = {
        "model_type": "deepseek_v41_text",
        "vocab_size": VOCAB,
        "hidden_size": 16,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 24,
        "q_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "max_position_embeddings": 1024,
        "sliding_window": 8,
        "candidate_topk_blocks": 2,
        "candidate_block_size": 2,
        "index_n_heads": 8,
        "index_head_dim": 24,
        "index_topk": 3,
        "o_groups": 2,
        "o_lora_rank": 16,
        "moe_intermediate_size": 16,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "scoring_func": "sqrtsoftplus",
        "gate_temp": 1.0,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "topk_method": "noaux_tc",
        "swiglu_limit": 10.0,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "engram_layer_ids": [],
        "engram_num_embeddings": [],
        "engram_vocab_size": 31,
        "engram_max_ngram_size": 3,
        "engram_n_heads": 2,
        "engram_head_dim": 32,
        "engram_pad_id": 2,
        "num_nextn_predict_layers": 0,
        "dspark_noise_token_id": VOCAB - 2,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-20,
        "eos_token_id": 1,
    }
    text.update(overrides)
    return text


# The reference fake-quantises activations as part of the model (QAT semantics): the window
# KV to FP8 per 32 channels, the compressed KV to FP4 per 16, the indexer q / k to FP4 per 32.
# Those roundings make the function discontinuous: two correct implementations whose GEMMs
# differ by 1 ulp can land on different sides of a rounding boundary, and the difference then
# grows through the layers (the reference itself gives different logits for a prompt's
# positions depending on how long the rest of the sequence is). The reference skips a
# quantiser when the width is not a multiple of its block, so the configs meant for strict
# parity use head_dim = index_head_dim = 24 (no activation quantiser runs); `qat` uses 32 so
# every quantiser runs, for tests that compare with that in mind.
#
# The FP4 expert format scales 32 inputs at a time: the quantized configs are twice as wide.
FP4_DIMS = {"hidden_size": 32, "moe_intermediate_size": 32, "q_lora_rank": 32}

# name -> text config, quantized (FP8 dense + FP4 experts), shards, prompt lengths, decode steps
CONFIGS = {
    # Sliding-window only (ratio 0 everywhere), BF16, one file.
    "sliding": dict(
        text=base_text_config(num_hidden_layers=2, compress_ratios=[0, 0], kv_source_layer_ids=[],
                              index_source_layer_ids=[], candidate_source_layer_id=-1),
        quantized=False, shards=1, prompts=[13, 5], decode=5,
    ),
    # The released shape in miniature: sliding, two ratio-2 layers (a KV + index source and a
    # reuser), ratio-1 decoder layers with their own KV source that is also the candidate
    # source, a Reindex source scoring inside the candidates; Engram on two layers; YaRN on
    # the compress rope; FP8 dense weights and FP4 experts; two shards with an index.
    "mixed": dict(
        text=base_text_config(
            num_hidden_layers=6, compress_ratios=[0, 2, 2, 1, 1, 1],
            kv_source_layer_ids=[1, 3], index_source_layer_ids=[1, 3, 5], candidate_source_layer_id=3,
            rope_scaling={"rope_type": "yarn", "factor": 4, "beta_fast": 32, "beta_slow": 1,
                          "original_max_position_embeddings": 256},
            engram_layer_ids=[0, 3], **FP4_DIMS,
        ),
        quantized=True, shards=2, prompts=[21, 6], decode=6,
    ),
    # A larger ratio (4) group with a Reindex source that does not own the keys, then a
    # ratio-1 group; no candidate level; Engram on one layer; BF16, one file.
    "ratio4": dict(
        text=base_text_config(
            num_hidden_layers=4, compress_ratios=[4, 4, 1, 1],
            kv_source_layer_ids=[0, 2], index_source_layer_ids=[0, 1, 2], candidate_source_layer_id=-1,
            index_topk=2, engram_layer_ids=[1],
        ),
        quantized=False, shards=1, prompts=[18, 3], decode=6,
    ),
    # Every activation quantiser active (head_dim / index_head_dim 32), ratio 2 and 1, FP8 / FP4.
    "qat": dict(
        text=base_text_config(
            num_hidden_layers=3, compress_ratios=[2, 1, 1], head_dim=32, index_head_dim=32,
            kv_source_layer_ids=[0, 1], index_source_layer_ids=[0, 1, 2], candidate_source_layer_id=1,
            **FP4_DIMS,
        ),
        quantized=True, shards=1, prompts=[16, 4], decode=4,
    ),
}

# A tiny word-level vocabulary for the Engram hash state: case, accent and leading-space
# variants that the reference's normalisation folds together, so the compressed vocabulary
# is smaller than the vocabulary.
WORDS = ["<s>", "</s>", "<pad>", "the", "The", "THE", " the", "a", "A", " a", "cat", "Cat", " cat",
         "café", "cafe", "CAFÉ", "dog", " dog", "Dog", "ran", "Ran", " ran", "ﬁsh", "fish", "  ", " ",
         "\t", "\n"]


def build_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = list(WORDS)
    i = 0
    while len(words) < VOCAB:
        words.append(f"w{i}")
        words.append(f"W{i}") if len(words) < VOCAB else None
        i += 1
    vocab = {w: n for n, w in enumerate(words[:VOCAB])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def engram_tables(text, modeling, cfg_cls):
    """engram_num_embeddings = the sum of each layer's primes (the layout the reference uses)."""
    probe = cfg_cls(**dict(text, engram_num_embeddings=[0] * len(text["engram_layer_ids"])))
    layout = modeling.EngramLayout.from_config(probe)
    return [sum(p for per in layer for p in per) for layer in layout.primes]


# ---------------------------------------------------------------------------------------
# weights


def random_weights(model, seed):
    """Deterministic random values with magnitudes that keep every branch active."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in model.state_dict().items():
        shape = tuple(p.shape)
        leaf = name.rsplit(".", 1)[-1]
        if "norm" in name and leaf == "weight":
            v = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif leaf in ("hc_attn_fn", "hc_ffn_fn"):
            v = 0.2 * torch.randn(shape, generator=g)
        elif leaf in ("hc_attn_base", "hc_ffn_base"):
            v = 0.5 * torch.randn(shape, generator=g)
        elif leaf in ("hc_attn_scale", "hc_ffn_scale"):
            v = 1.0 + 0.2 * torch.randn(shape, generator=g)
        elif leaf == "attn_sink":
            v = 0.5 * torch.randn(shape, generator=g)
        elif name.endswith("gate.bias") or name.endswith("gate.bias_vl"):
            v = 0.3 * torch.randn(shape, generator=g)  # the noaux_tc correction bias, non-zero
        elif name.endswith("engram.embed.scale"):
            v = torch.ones(shape)
        elif leaf in ("q_weight", "k_weight"):
            v = 1.0 + 0.3 * torch.randn(shape, generator=g)
        elif name.endswith("embed.weight") and "engram" not in name:
            v = torch.randn(shape, generator=g)
        elif name.endswith("engram.embed.weight"):
            v = torch.randn(shape, generator=g)
        elif len(shape) == 2:
            v = torch.randn(shape, generator=g) / shape[1] ** 0.5
        else:
            raise SystemExit(f"no rule for {name} {shape}")
        out[name] = v.float()
    return out


def released_name(name):
    if name == "lm_head.weight":
        return "head.weight"
    assert name.startswith("model."), name
    return name[len("model."):]


FP8_DENSE = ("attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight",
             "attn.wo_b.weight", "attn.indexer.wq_b.weight", "shared_experts.w1.weight",
             "shared_experts.w2.weight", "shared_experts.w3.weight", "engram.wkv.weight")
F32_LEAVES = ("hc_attn_fn", "hc_attn_base", "hc_attn_scale", "hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale",
              "attn_sink", "bias", "bias_vl")


def e8m0(k):
    """E8M0 codes (uint8 = 127 + k) as torch float8_e8m0fnu."""
    return (k + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def quantize_fp8_blocks(w, modeling, block=128):
    """FP8 E4M3 with one power-of-two scale per 128x128 block (released dense format).
    Returns (e4m3 tensor, e8m0 scale [ceil(out/128), ceil(in/128)], dequantized fp32)."""
    rows, cols = w.shape
    br, bc = -(-rows // block), -(-cols // block)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    deq = torch.empty(rows, cols)
    k = torch.empty(br, bc, dtype=torch.int32)
    for i in range(br):
        for j in range(bc):
            blk = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            amax = blk.abs().amax().clamp_min(1e-12)
            scale = modeling._pow2_ceil_scale((amax / 448.0).reshape(1))[0]
            k[i, j] = int(torch.log2(scale).round().item())
            qb = (blk / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
            q[i * block:(i + 1) * block, j * block:(j + 1) * block] = qb
            deq[i * block:(i + 1) * block, j * block:(j + 1) * block] = qb.float() * scale
    return q, e8m0(k), deq


def quantize_fp4_rows(w, modeling, block=32):
    """Packed E2M1 (low nibble = even column) with one power-of-two scale per 32 inputs of a
    row (released expert format). Returns (int8 [out, in/2], e8m0 [out, in/32], dequantized)."""
    rows, cols = w.shape
    assert cols % block == 0
    blocks = w.view(rows, cols // block, block)
    amax = blocks.abs().amax(-1).clamp_min(1e-12)
    scale = modeling._pow2_ceil_scale((amax / 6.0).contiguous())
    q = (blocks / scale.unsqueeze(-1)).clamp(-6.0, 6.0)
    codes = modeling._e2m1_codes(q).view(rows, cols)
    deq = (modeling._FP4_TABLE[codes.long()].view(rows, cols // block, block) * scale.unsqueeze(-1)).view(rows, cols)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    k = torch.log2(scale).round().to(torch.int32)
    return packed.contiguous(), e8m0(k), deq


def to_checkpoint(weights, quantized, modeling):
    """Returns (tensors in the released layout, fp32 weights the reference must run with)."""
    tensors, effective = {}, {}
    for name, w in weights.items():
        out = released_name(name)
        leaf = name.rsplit(".", 1)[-1]
        if leaf in F32_LEAVES or name.endswith("gate.bias_vl"):
            tensors[out] = w.contiguous()
            effective[name] = w
        elif name.endswith("engram.embed.scale"):
            # One E8M0 scale per 32 channels of a row; all 1.0 here, so the table reads the same
            # whether a loader applies the scales or not.
            tensors[out] = e8m0(torch.zeros(w.shape, dtype=torch.int32))
            effective[name] = torch.ones(w.shape)
        elif name.endswith("engram.embed.weight"):
            q = w.to(torch.float8_e4m3fn)
            tensors[out] = q.contiguous()
            effective[name] = q.float()
        elif quantized and ".ffn.experts." in name:
            packed, scale, deq = quantize_fp4_rows(w, modeling)
            tensors[out] = packed
            tensors[out[: -len(".weight")] + ".scale"] = scale
            effective[name] = deq
        elif quantized and name.endswith(FP8_DENSE):
            q, scale, deq = quantize_fp8_blocks(w, modeling)
            tensors[out] = q.contiguous()
            tensors[out[: -len(".weight")] + ".scale"] = scale
            effective[name] = deq
        else:
            b = w.to(torch.bfloat16)
            tensors[out] = b.contiguous()
            effective[name] = b.float()
    return tensors, effective


def write_checkpoint(directory, tensors, shards):
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return
    # split by layer: embed and the first layers in shard 1, the rest and head in shard 2
    weight_map = {}
    files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    parts = [dict() for _ in range(shards)]
    for n in names:
        layer = int(n.split(".")[1]) if n.startswith("layers.") else (-1 if n.startswith("embed") else 10**6)
        part = 0 if layer < 3 else 1
        parts[part][n] = tensors[n]
        weight_map[n] = files[part]
    total = 0
    for f, p in zip(files, parts):
        save_file(p, str(directory / f), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in p.values())
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------
# goldens


def run_config(name, spec, out_root, cfg_mod, modeling, tokenizer):
    torch.manual_seed(0)
    text = dict(spec["text"])
    if text["engram_layer_ids"]:
        text["engram_num_embeddings"] = engram_tables(text, modeling, cfg_mod.DeepseekV41TextConfig)
        token_map, compressed = modeling.build_compressed_token_map(tokenizer)
        text["engram_compressed_vocab_size"] = compressed
    composite = {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "image_token_id": VOCAB - 1,
        "tie_word_embeddings": False,
        "text_config": text,
        "vision_config": {"hidden_size": 16, "intermediate_size": 64, "num_hidden_layers": 2,
                          "num_attention_heads": 2, "patch_size": 14, "downsample_ratio": 3,
                          "max_image_tokens": 16, "min_pixels": 3136},
    }
    if spec["quantized"]:
        composite["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                            "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
        composite["expert_dtype"] = "fp4"

    config = cfg_mod.DeepseekV41Config(**json.loads(json.dumps(composite)))
    config.get_text_config()._attn_implementation = "eager"
    model = modeling.DeepseekV41ForCausalLM(config).eval()
    model.config._attn_implementation = "eager"

    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
    weights = random_weights(model, seed)
    tensors, effective = to_checkpoint(weights, spec["quantized"], modeling)
    model.load_state_dict(effective, strict=True)
    if text["engram_layer_ids"]:
        model.model.bind_tokenizer(tokenizer)

    directory = out_root / name
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.safetensors"):
        old.unlink()
    (directory / "config.json").write_text(json.dumps(composite, indent=1) + "\n")
    write_checkpoint(directory, tensors, spec["shards"])

    gen = torch.Generator().manual_seed(seed ^ 0x5EED)
    golden = {}
    # Every tensor the reference holds, by released name: its logical shape, the dtype it is
    # stored in, and sums of the float32 values the reference ran with (dequantized), so a
    # loader can check names, shapes and its dequantization without a copy of the weights.
    listing = {}
    for hf_name, w in effective.items():
        out = released_name(hf_name)
        w64 = w.double()
        listing[out] = {"shape": list(w.shape), "dtype": str(tensors[out].dtype).replace("torch.", ""),
                        "sum": w64.sum().item(), "sum_abs": w64.abs().sum().item(),
                        "sum_sq": (w64 * w64).sum().item(),
                        # position-weighted, so a permutation (a swapped nibble order) shows
                        "sum_pos": (w64.flatten() * (torch.arange(w.numel(), dtype=torch.float64) % 251 + 1)).sum().item()}
    meta = {"tensors": listing, "prompts": [], "probe": {
        "jitter": SELECT_JITTER, "seeds": len(SELECT_SEEDS), "bound": SELECT_BOUND}}

    def whole_logits(full):
        if text["engram_layer_ids"]:
            model.model.bind_tokenizer(tokenizer)
        return model(input_ids=full[None], use_cache=True).logits[0].float()

    for p, length in enumerate(spec["prompts"]):
        # Draw until the sequence's logits are stable under the probe (see `probe`).
        for attempt in range(64):
            prompt = torch.randint(3, VOCAB - 1, (length,), generator=gen)
            decode = torch.randint(3, VOCAB - 1, (spec["decode"],), generator=gen)
            full = torch.cat([prompt, decode])
            with torch.no_grad():
                change, _ = probe(model, lambda: (whole_logits(full), []))
            print(f"{name} prompt {p} draw {attempt}: logits move by {change:.2e} under the probe")
            if change <= SELECT_BOUND:
                break
        else:
            sys.exit(f"{name}: no stable prompt of length {length} in 64 draws")
        with torch.no_grad():
            # prefill, then one token at a time through the cache
            hooks, streams = [], {}
            if p == 0:
                for i, layer in enumerate(model.model.layers):
                    hooks.append(layer.register_forward_hook(
                        lambda m, a, o, i=i: streams.__setitem__(i, o[0][0].detach().clone())))
            if text["engram_layer_ids"]:
                model.model.bind_tokenizer(tokenizer)  # fresh n-gram history per sequence
            res = model(input_ids=prompt[None], use_cache=True)
            for h in hooks:
                h.remove()
            cache = res.past_key_values
            prefill_logits = res.logits[0].float()
            steps = []
            for t in decode:
                step = model(input_ids=t.view(1, 1), past_key_values=cache, use_cache=True)
                cache = step.past_key_values
                steps.append(step.logits[0, -1].float())
            decode_logits = torch.stack(steps)
            # the whole sequence in one prefill. Always through a cache: the reference's
            # use_cache=False path appends a later KV source's entries to the previous group's
            # in its per-forward `shared` dict (two KV sources => wrong), the cache path does not.
            if text["engram_layer_ids"]:
                model.model.bind_tokenizer(tokenizer)
            whole = model(input_ids=full[None], use_cache=True).logits[0].float()
            # chunked prefill: the prompt in two chunks through the cache, split at an odd
            # length so a compress group straddles the chunks
            split = length // 2 + 1 if length > 2 else 1
            if text["engram_layer_ids"]:
                model.model.bind_tokenizer(tokenizer)
            first = model(input_ids=prompt[None, :split], use_cache=True)
            second = model(input_ids=prompt[None, split:], past_key_values=first.past_key_values, use_cache=True)
            chunked = torch.cat([first.logits[0], second.logits[0]]).float()
        key = f"prompt{p}"
        golden[f"{key}.chunked_prefill_logits"] = chunked.contiguous()
        golden[f"{key}.input_ids"] = prompt.to(torch.int64)
        golden[f"{key}.decode_ids"] = decode.to(torch.int64)
        golden[f"{key}.prefill_logits"] = prefill_logits.contiguous()
        golden[f"{key}.decode_logits"] = decode_logits.contiguous()
        golden[f"{key}.full_logits"] = whole.contiguous()
        for i, s in streams.items():
            golden[f"{key}.layer{i}.streams"] = s.float().contiguous()
        if text["engram_layer_ids"]:
            hs = modeling.DeepseekV41NgramHashState(model.model.config, tokenizer)
            ids = hs(full[None], torch.arange(full.numel())[None], None)[0]
            golden[f"{key}.engram_hash_ids"] = ids.to(torch.int64).contiguous()
        diff_prefill = (whole[:length] - prefill_logits).abs().max().item()
        diff_decode = (whole[length:] - decode_logits).abs().max().item()
        meta["prompts"].append({"length": length, "decode_steps": int(decode.numel()), "chunk_split": split,
                                "draws": attempt + 1, "probe_change": change,
                                "max_abs_diff_chunked_vs_prefill": (chunked - prefill_logits).abs().max().item(),
                                "max_abs_diff_full_vs_prefill": diff_prefill,
                                "max_abs_diff_full_vs_decode": diff_decode})
    save_file(golden, str(directory / "golden.safetensors"), metadata={"format": "pt"})
    if text["engram_layer_ids"]:
        hs = modeling.DeepseekV41NgramHashState(model.model.config, tokenizer)
        (directory / "engram_meta.json").write_text(json.dumps({
            "token_map": hs.token_map.tolist(),
            "compressed_vocab_size": int(text["engram_compressed_vocab_size"]),
            "pad_id": int(text["engram_pad_id"]),
            "pad_compressed_id": int(hs.pad_id),
            "multipliers": [[str(int(v)) for v in row] for row in hs.multipliers],
            "primes": [list(map(int, [p for per in layer for p in per])) for layer in hs.layout.primes],
            "offsets": hs.offsets.tolist(),
        }, indent=1) + "\n")
    meta["oracle"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                      "files_sha256": ORACLE_SHA256}
    (directory / "golden.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    print(name, json.dumps(meta["prompts"]))
    worst = max(max(p["max_abs_diff_full_vs_prefill"], p["max_abs_diff_full_vs_decode"],
                    p["max_abs_diff_chunked_vs_prefill"]) for p in meta["prompts"])
    if worst > 1e-4:
        # a discontinuity (a top-k tie or a rounding boundary) decided differently for the
        # same positions: the goldens would not pin the function down; change the config
        sys.exit(f"{name}: the reference disagrees with itself (full vs prefill / decode) by {worst}")
    return meta


def load_released(directory, modeling, mtp=False):
    """The tensors of a model directory (single file or sharded) dequantized to float32, under
    the reference's parameter names; with mtp, only the DSpark draft tensors (`mtp.*`, which the
    reference has no modules for) under their released names."""
    from safetensors.torch import load_file

    raw = {}
    index = directory / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    for f in files:
        raw.update(load_file(str(directory / f)))
    quant = json.loads((directory / "config.json").read_text()).get("quantization_config") or {}
    br, bc = quant.get("weight_block_size", [128, 128])
    out = {}
    for name, t in raw.items():
        if name.startswith("mtp.") != mtp:  # the DSpark draft layers: the reference has none
            continue
        if name.endswith(".scale") and not name.endswith("engram.embed.scale"):
            continue
        scale = raw.get(name[: -len(".weight")] + ".scale") if name.endswith(".weight") else None
        if scale is not None and t.dtype == torch.int8:  # packed FP4, per-32 scales
            u = t.view(torch.uint8)
            codes = torch.stack([u & 0xF, u >> 4], dim=-1).flatten(-2)
            values = modeling._FP4_TABLE[codes.long()]
            s = scale.float().repeat_interleave(32, dim=-1)
            w = values * s
        elif scale is not None and t.dtype == torch.float8_e4m3fn and not name.endswith("engram.embed.weight"):
            s = scale.float().repeat_interleave(br, 0).repeat_interleave(bc, 1)[: t.shape[0], : t.shape[1]]
            w = t.float() * s
        else:
            w = t.float()
        hf = "lm_head.weight" if name == "head.weight" else "model." + name
        out[name if mtp else hf] = w
    return out


def reference_from_dir(directory, cfg_mod, modeling):
    """The reference model with a model directory's weights, loaded strictly (every parameter
    present, no extra tensor, same shapes). Returns (model, number of tensors loaded)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    composite = json.loads((directory / "config.json").read_text())
    text = composite["text_config"]
    tokenizer = None
    if text.get("engram_layer_ids"):
        # No tokenizer ships with a random model: bind distinct lowercase words, one per id,
        # so the compressed vocabulary is the identity.
        vocab = {f"t{i}": i for i in range(text["vocab_size"])}
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0")))
        text["engram_compressed_vocab_size"] = text["vocab_size"]
    config = cfg_mod.DeepseekV41Config(**composite)
    model = modeling.DeepseekV41ForCausalLM(config).eval()
    model.config._attn_implementation = "eager"
    weights = load_released(directory, modeling)
    model.load_state_dict(weights, strict=True)
    if tokenizer is not None:
        model.model.bind_tokenizer(tokenizer)
    return model, len(weights)


def check_model_dir(directory, cfg_mod, modeling):
    """Loads a model directory written by `troupe model init` into the reference and runs a
    short prompt with a decode step."""
    model, loaded = reference_from_dir(directory, cfg_mod, modeling)
    vocab = model.config.vocab_size
    ids = torch.arange(3, 3 + 12)[None] % vocab
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        step = model(input_ids=ids[:, -1:], past_key_values=out.past_key_values, use_cache=True)
    logits = torch.cat([out.logits, step.logits], dim=1)
    assert torch.isfinite(logits).all(), "non-finite logits"
    n = sum(p.numel() for p in model.parameters())
    print(f"{directory}: the reference loads all {loaded} tensors ({n / 1e6:.1f} M parameters) strictly; "
          f"logits finite, std {logits.std().item():.3f}")


def fnv1a64_int32(values):
    """FNV-1a 64 over the values as little-endian int32 bytes (easy to recompute in C++)."""
    h = 0xcbf29ce484222325
    for b in np.asarray(values, dtype="<i4").tobytes():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def engram_flash_golden(out_root, modeling):
    """The Engram hashing inputs of the released model: the compressed token map the reference
    derives from the DeepSeek-V4 tokenizer (recipe/data/deepseek-v4, the tokenizer of the V4
    family) and the hash multipliers of the released Engram layers [1, 14] (max n-gram 4)."""
    import gzip
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    path = REPO / "recipe" / "data" / "deepseek-v4" / "tokenizer.json.gz"
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(gzip.open(path).read().decode()))
    token_map, size = modeling.build_compressed_token_map(tok)
    flash = json.loads((REPO / "examples" / "models" / "DeepSeek-V4.1-Flash" / "config.json").read_text())["text_config"]
    layers, ngram = tuple(flash["engram_layer_ids"]), flash["engram_max_ngram_size"]
    multipliers = modeling.compute_hash_multipliers(layers, ngram, size)
    step = 97  # a deterministic sample of the map, plus every id whose key merged with an earlier one
    first_of = {}
    merged = []
    for i, c in enumerate(token_map):
        if c in first_of:
            merged.append(i)
        else:
            first_of[c] = i
    sample = sorted(set(range(0, len(token_map), step)) | set(merged[:: max(1, len(merged) // 1500)]))
    doc = {
        "tokenizer": "recipe/data/deepseek-v4/tokenizer.json.gz",
        "vocab_size": len(token_map),
        "compressed_vocab_size": size,
        "config_engram_compressed_vocab_size": flash["engram_compressed_vocab_size"],
        "token_map_fnv1a64_int32le": str(fnv1a64_int32(token_map)),
        "token_map_sample": {str(i): token_map[i] for i in sample},
        "engram_layer_ids": list(layers),
        "engram_max_ngram_size": ngram,
        "multipliers": [[str(int(v)) for v in row] for row in multipliers],
        "pad_id": flash.get("engram_pad_id", 2),
        "pad_compressed_id": token_map[flash.get("engram_pad_id", 2)],
    }
    (out_root / "engram-v41-flash.json").write_text(json.dumps(doc, indent=0, sort_keys=True) + "\n")
    print(f"engram-v41-flash: compressed vocabulary {size} (config says {flash['engram_compressed_vocab_size']}), "
          f"{len(sample)} sampled ids")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--oracle", required=True, type=pathlib.Path,
                    help="directory holding the upstream configuration_deepseek_v41.py and modeling_deepseek_v41.py")
    ap.add_argument("--out", type=pathlib.Path, default=REPO / "tests" / "kernels" / "golden" / "model")
    ap.add_argument("--only", nargs="*", help="config names (default: all)")
    ap.add_argument("--check-model", type=pathlib.Path, nargs="*",
                    help="instead: load these `troupe model init` directories into the reference and run them")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg_mod, modeling = load_oracle(args.oracle.resolve())
    for stem in ("configuration_deepseek_v41", "modeling_deepseek_v41"):
        ORACLE_SHA256[f"{stem}.py"] = hashlib.sha256((args.oracle / f"{stem}.py").read_bytes()).hexdigest()
    if args.check_model:
        for d in args.check_model:
            check_model_dir(d, cfg_mod, modeling)
        return
    tokenizer = build_tokenizer()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or CONFIGS:
        run_config(name, CONFIGS[name], args.out, cfg_mod, modeling, tokenizer)
    if not args.only:
        engram_flash_golden(args.out, modeling)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")


if __name__ == "__main__":
    main()

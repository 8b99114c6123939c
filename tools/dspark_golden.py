"""Goldens for the DSpark draft call (kernels/model.hpp `model::draft`).

The transformers reference at the pinned commit has no DSpark modules (it ignores `mtp.*`),
and DeepSeek's own inference code needs CUDA kernels and cannot run here. So this is a partial
oracle: the
target model, the draft features (the attention input streams of dspark_target_layer_ids,
averaged over hc_mult) and every building block of a draft stage — mHC mixes / collapse /
expand, the norms, the attention projections, rope and FP8 rounding, the sink softmax, the MoE
router and experts — are the reference's own modules (`DeepseekV41DecoderLayer` built with the
draft stage's expert count, loaded with the `mtp.<i>.*` weights), run on torch CPU in fp32.
What glues them is written here from our reading of DeepSeek's DSpark, compared step by step
with DeepSeek's V4.1 inference/model.py and vLLM's V4.1 DSpark model (docs/model.md):
main_proj / main_norm into the context K=V, the block [anchor, noise...] seeing the last
`sliding_window` context rows and the whole block, the Markov bias, the confidence head.
Parity therefore checks that the C++ computes that reading with the reference's arithmetic;
that the reading is DeepSeek's rests on the comparison, not on this script.

    build/troupe model init --preset tiny --seed 11 --out /tmp/dspark-tiny
    tools/.venv-model/bin/python tools/dspark_golden.py --oracle /work/oracle/deepseek_v41 \\
        --model /tmp/dspark-tiny --out tests/kernels/golden/model/dspark/golden.json
"""
import argparse
import copy
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import model_golden as mg  # noqa: E402

# The cases: a short context and one longer than the window, each the first of a family of
# candidate prompts whose outputs are stable under the probe (model_golden.probe): no FP8
# window rounding, router choice or draft argmax within the jitter of its boundary, so the
# C++ on any BLAS kernel takes the decisions the reference took (tests/kernels/
# model_fixture.hpp). The first candidates of the earlier goldens were not: the 40-token
# prompt had one layer-3 window element on an FP8 rounding boundary, and the comparison
# failed under OpenBLAS's SkylakeX and Prescott kernels only.
FAMILIES = [  # (length, multiplier, offset, anchor); salt 0 is the earlier goldens' prompt
    (20, 37, 16, 42),
    (40, 53, 9, 7),
]


def candidates(length, mult, offset):
    for salt in range(256):
        yield [(i * mult + offset + 11 * salt) % 250 for i in range(length)]


def features(model, tokens, targets):
    """The draft features of every prompt token and the target's logits."""
    captured = {}
    hooks = []
    for k, layer_id in enumerate(targets):
        layer = model.model.layers[layer_id]
        assert layer.engram is None, "a target layer with Engram: its attention input is after it"

        def hook(_module, args, k=k):
            captured[k] = args[0].float().mean(dim=2)[0]  # [T, D]
        hooks.append(layer.register_forward_pre_hook(hook))
    with torch.no_grad():
        out = model(input_ids=torch.tensor([tokens]), use_cache=True)
    for h in hooks:
        h.remove()
    return torch.cat([captured[k] for k in range(len(targets))], dim=-1)


def draft(model, modeling, stages, heads, feats, anchor):
    cfg = model.config
    D, hc, window = cfg.hidden_size, cfg.hc_mult, cfg.sliding_window
    B, noise, eps = cfg.dspark_block_size, cfg.dspark_noise_token_id, cfg.rms_norm_eps
    L = feats.shape[0]
    rotary = model.model.rotary_emb

    def rms(x, w):
        x = x.float()
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rope(x, positions, inverse=False):
        cos, sin = rotary(x, positions[None], layer_type="main")
        return modeling.apply_rotary_pos_emb(x, cos, sin, inverse=inverse)

    main_x = rms(feats @ heads["main_proj"].T, heads["main_norm"])[None]  # [1, L, D]
    ctx_pos = torch.arange(L)
    blk_pos = L + torch.arange(B)
    ids = torch.tensor([[anchor] + [noise] * (B - 1)])
    streams = model.model.embed(ids).unsqueeze(2).expand(-1, -1, hc, -1).contiguous()
    pre_mix = streams.new_zeros(*streams.shape[:-1])
    pre_mix[..., 0] = 1.0
    for layer in stages:
        a = layer.attn
        ctx = a.kv_norm(a.wkv(main_x))
        ctx = modeling._fake_quant_fp8_block(rope(ctx, ctx_pos), block_size=32)[:, -window:]

        def attention(x):
            q = a.wq_b(a.q_norm(a.wq_a(x))).view(1, B, a.num_heads, a.head_dim)
            q = rope(q, blk_pos).transpose(1, 2)
            kv = modeling._fake_quant_fp8_block(rope(a.kv_norm(a.wkv(x)), blk_pos), block_size=32)
            keys = torch.cat([ctx, kv], dim=1).unsqueeze(1)  # [1, 1, window + B, hd]
            o, _ = modeling.eager_attention_forward(a, q, keys, keys, None, scaling=a.scaling)
            o = rope(o, blk_pos, inverse=True)
            return a.wo_b(a.wo_a(o.reshape(1, B, cfg.o_groups, -1)).flatten(2))

        residual = streams
        attn_pre, post, comb = layer.hc_mixes(streams, layer.hc_attn_fn, layer.hc_attn_scale, layer.hc_attn_base)
        out = attention(layer.attn_norm(layer.hc_collapse(streams, pre_mix)))
        streams = layer.hc_expand(out, residual, post, comb)
        residual = streams
        ffn_pre, post, comb = layer.hc_mixes(streams, layer.hc_ffn_fn, layer.hc_ffn_scale, layer.hc_ffn_base)
        out = layer.ffn(layer.ffn_norm(layer.hc_collapse(streams, attn_pre)))
        streams = layer.hc_expand(out, residual, post, comb)
        pre_mix = ffn_pre
    h = modeling.DeepseekV41DecoderLayer.hc_collapse(streams, pre_mix)[0]  # [B, D]
    logits = rms(h, heads["norm"]) @ model.lm_head.weight.T
    tokens, conf = [], []
    prev = anchor
    for k in range(B):
        e = heads["markov_embed"][prev]
        logits[k] += heads["markov_head"] @ e
        score = heads["confidence"][0] @ torch.cat([h[k], e])
        prev = int(logits[k].argmax())
        tokens.append(prev)
        conf.append(float(torch.sigmoid(score)))
    return tokens, conf, logits


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--oracle", required=True, type=pathlib.Path)
    ap.add_argument("--model", required=True, type=pathlib.Path, help="a `troupe model init` directory")
    ap.add_argument("--out", required=True, type=pathlib.Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg_mod, modeling = mg.load_oracle(args.oracle.resolve())
    model, _ = mg.reference_from_dir(args.model, cfg_mod, modeling)
    cfg = model.config
    mtp = mg.load_released(args.model, modeling, mtp=True)
    n, stages_n = cfg.num_hidden_layers, cfg.num_nextn_predict_layers
    dcfg = copy.deepcopy(cfg)
    dcfg.n_routed_experts = cfg.dspark_n_routed_experts
    dcfg.num_experts_per_tok = cfg.dspark_num_experts_per_tok
    dcfg.compress_ratios = list(cfg.compress_ratios[:n]) + [0] * stages_n
    last = f"mtp.{stages_n - 1}."
    heads = {
        "main_proj": mtp.pop("mtp.0.main_proj.weight"),
        "main_norm": mtp.pop("mtp.0.main_norm.weight"),
        "norm": mtp.pop(last + "norm.weight"),
        "markov_embed": mtp.pop(last + "markov_head.embed.weight"),
        "markov_head": mtp.pop(last + "markov_head.head.weight"),
        "confidence": mtp.pop(last + "confidence_head.proj.weight"),
    }
    stages = []
    for i in range(stages_n):
        layer = modeling.DeepseekV41DecoderLayer(dcfg, n + i).eval()
        prefix = f"mtp.{i}."
        state = {k[len(prefix):]: mtp.pop(k) for k in list(mtp) if k.startswith(prefix)}
        layer.load_state_dict(state, strict=True)
        stages.append(layer)
    assert not mtp, f"unused draft tensors: {sorted(mtp)}"
    doc = {"model": "troupe model init --preset tiny --seed 11",
           "probe": {"jitter": mg.SELECT_JITTER, "seeds": len(mg.SELECT_SEEDS),
                     "bound": mg.SELECT_BOUND},
           "cases": []}
    everything = torch.nn.ModuleList([model, *stages])
    targets = list(cfg.dspark_target_layer_ids)

    def run(prompt, anchor):
        f = features(model, prompt, targets)
        tokens, conf, logits = draft(model, modeling, stages, heads, f, anchor)
        return f, tokens, conf, logits

    with torch.no_grad():
        for length, mult, offset, anchor in FAMILIES:
            for salt, prompt in enumerate(candidates(length, mult, offset)):
                def compute():
                    f, tokens, conf, logits = run(prompt, anchor)
                    return torch.cat([f.flatten(), logits.flatten(), torch.tensor(conf)]), tokens
                change, flipped = mg.probe(everything, compute)
                print(f"prompt {length} salt {salt}: outputs move by {change:.2e} under the jitter"
                      + (", a draft changes" if flipped else ""))
                if change <= mg.SELECT_BOUND and not flipped:
                    break
            else:
                sys.exit(f"no stable prompt of length {length} among the candidates")
            f, tokens, conf, logits = run(prompt, anchor)
            doc["cases"].append({
                "prompt": prompt, "anchor": anchor, "probe_change": change,
                "features": f.flatten().tolist(),
                "tokens": tokens, "confidences": conf, "logits": logits.flatten().tolist(),
            })
            print(f"prompt {len(prompt)}, anchor {anchor}: drafts {tokens}, confidences "
                  + ", ".join(f"{c:.3f}" for c in conf))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc) + "\n")


if __name__ == "__main__":
    main()

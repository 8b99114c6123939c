"""Writes the safetensors goldens of tests/kernels/fixtures/golden/ with Python `safetensors`.

The inputs are encoded and the expected float32 values decoded by `ml_dtypes` (bfloat16,
float8_e4m3fn, float8_e8m0fnu, float4_e2m1fn) and numpy, independently of troupe's C++
conversions, which the tests compare against them. Deterministic (fixed seed); rerun with
    tools/.venv-model/bin/python tools/safetensors_golden.py
after changing it, and commit the outputs (keep them small: < 100 KB in all).
"""
import json
import pathlib

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file
from safetensors import TensorSpec, serialize_file

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "kernels" / "fixtures" / "golden"
rng = np.random.default_rng(20261129)


_keep_alive = []


def raw(dtype_name, shape, array):
    """A TensorSpec for safetensors.serialize_file over an ml_dtypes / numpy array's bytes."""
    a = np.ascontiguousarray(array).view(np.uint8)
    _keep_alive.append(a)
    torch_names = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "I8": "int8",
                   "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu"}
    return TensorSpec(dtype=torch_names[dtype_name], shape=list(shape), data_ptr=a.ctypes.data,
                      data_len=a.nbytes)


def f32(a):
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


def dtypes_file():
    """One tensor per plain dtype, and every fp8 e4m3 / e8m0 / fp4 code point."""
    specials = np.array([0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, 3.0e38, 1.0e-40], dtype=np.float32)
    bf = np.concatenate([specials, rng.normal(0, 3, 56).astype(np.float32)]).astype(ml_dtypes.bfloat16)
    hf = np.concatenate([np.array([0.0, -0.0, 65504.0, 6.0e-8, np.inf, -1.0], np.float32),
                         rng.normal(0, 100, 58).astype(np.float32)]).astype(np.float16)
    fl = rng.normal(0, 1, 16).astype(np.float32)
    e4m3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    e8m0 = np.arange(255, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)  # 0xff is NaN
    tensors = {
        "bf16": raw("BF16", [8, 8], bf.reshape(8, 8)),
        "f16": raw("F16", [64], hf),
        "f32": raw("F32", [4, 4], fl.reshape(4, 4)),
        "e4m3_all": raw("F8_E4M3", [16, 16], e4m3.reshape(16, 16)),
        "e8m0_all": raw("F8_E8M0", [255], e8m0),
    }
    serialize_file(tensors, str(OUT / "dtypes.safetensors"), metadata={"format": "pt"})
    expected = {
        "bf16": f32(bf.astype(np.float32)).reshape(8, 8),
        "f16": f32(hf.astype(np.float32)),
        "f32": fl.reshape(4, 4),
        "e4m3_all": f32(e4m3.astype(np.float32)).reshape(16, 16),
        "e8m0_all": f32(e8m0.astype(np.float32)),
    }
    save_file(expected, str(OUT / "dtypes.expected.safetensors"))


def fp8_block_file():
    """A released-style dense FP8 weight with its 128x128 E8M0 block scales (`.scale`), and a
    DeepSeek-V3-style one with F32 `weight_scale_inv`."""
    rows, cols = 136, 136  # two blocks each way, the second partial
    codes = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x30  # no NaN codes in a weight
    w = codes.view(ml_dtypes.float8_e4m3fn)
    scale_codes = np.array([[120, 127], [130, 133]], dtype=np.uint8)  # 2^-7, 1, 8, 64
    s = scale_codes.view(ml_dtypes.float8_e8m0fnu)
    deq = w.astype(np.float64) * np.repeat(np.repeat(s.astype(np.float64), 128, 0), 128, 1)[:rows, :cols]
    w3 = rng.integers(0, 0x7E, (20, 12), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    s3 = np.array([[0.25]], dtype=np.float32)
    tensors = {
        "layers.0.attn.wq_a.weight": raw("F8_E4M3", [rows, cols], w),
        "layers.0.attn.wq_a.scale": raw("F8_E8M0", [2, 2], s),
        "model.layers.0.self_attn.q_a_proj.weight": raw("F8_E4M3", [20, 12], w3),
        "model.layers.0.self_attn.q_a_proj.weight_scale_inv": raw("F32", [1, 1], s3),
    }
    serialize_file(tensors, str(OUT / "fp8_block.safetensors"))
    save_file({
        "wq_a.row_sums": f32(deq.sum(1)),
        "wq_a.col_sums": f32(deq.sum(0)),
        "wq_a.corner": f32(deq[120:136, 120:136]),
        "q_a_proj": f32(w3.astype(np.float64) * 0.25),
    }, str(OUT / "fp8_block.expected.safetensors"))


def fp4_expert_file():
    """A routed expert's packed FP4 weight (two E2M1 values per byte, low nibble first) as I8
    [rows, cols/2] with E8M0 scales per 32 values [rows, cols/32]."""
    rows, cols = 8, 64
    nibbles = rng.integers(0, 16, (rows, cols), dtype=np.uint8)
    packed = (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).astype(np.uint8).view(np.int8)
    lut = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
    # Decode with ml_dtypes: its float4_e2m1fn stores one value per byte in the low nibble.
    decoded = nibbles.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert np.array_equal(decoded, lut[nibbles])
    scale_codes = rng.integers(124, 131, (rows, cols // 32), dtype=np.uint8)
    s = scale_codes.view(ml_dtypes.float8_e8m0fnu)
    deq = decoded.astype(np.float64) * np.repeat(s.astype(np.float64), 32, 1)
    tensors = {
        "layers.0.ffn.experts.0.w1.weight": raw("I8", [rows, cols // 2], packed),
        "layers.0.ffn.experts.0.w1.scale": raw("F8_E8M0", [rows, cols // 32], s),
    }
    serialize_file(tensors, str(OUT / "fp4_expert.safetensors"))
    save_file({"w1": f32(deq)}, str(OUT / "fp4_expert.expected.safetensors"))


def sharded():
    """Two shards and their model.safetensors.index.json, as `save_pretrained` writes them."""
    d = OUT / "sharded"
    d.mkdir(exist_ok=True)
    a = {"embed.weight": rng.normal(0, 1, (6, 4)).astype(np.float32),
         "layers.0.attn_norm.weight": np.ones(4, np.float32)}
    b = {"head.weight": rng.normal(0, 1, (6, 4)).astype(np.float32),
         "norm.weight": np.full(4, 2.0, np.float32)}
    save_file(a, str(d / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    save_file(b, str(d / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    weight_map = {k: "model-00001-of-00002.safetensors" for k in a}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in b})
    index = {"metadata": {"total_size": sum(v.nbytes for v in {**a, **b}.values())},
             "weight_map": dict(sorted(weight_map.items()))}
    (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    save_file({"embed.weight": a["embed.weight"], "head.weight": b["head.weight"]},
              str(OUT / "sharded.expected.safetensors"))


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    dtypes_file()
    fp8_block_file()
    fp4_expert_file()
    sharded()
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {OUT} ({total} bytes)")

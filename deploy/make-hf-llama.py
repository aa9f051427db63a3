#!/usr/bin/env python3
"""Writes a small random Llama model as a Hugging Face checkpoint directory.

The directory holds what `transformers` writes for `LlamaForCausalLM`:
config.json and either model.safetensors or --shards shard files named by
model.safetensors.index.json, in F32 or BF16. Nothing but the Python standard
library is used (struct, json, random): the safetensors writer here is
independent of Varipipe's, so tests that load these files check the reader
against a second implementation of the format. The quickstart fine-tunes
such a model (training.init_from).

Weights: normal(0, 0.02) from Python's seeded generator, norms one; the draw
order is the tensors' sorted names.

Usage: make-hf-llama.py --out DIR [--layers 4] [--hidden 64] [--heads 4]
         [--kv-heads 2] [--ffn 128] [--vocab 128] [--dtype F32|BF16]
         [--shards N] [--tied] [--seed 1]
"""

import argparse
import json
import os
import random
import struct
import sys


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory to create (or fill)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ffn", type=int, default=128)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--max-positions", type=int, default=2048)
    p.add_argument("--dtype", choices=["F32", "BF16"], default="F32")
    p.add_argument("--shards", type=int, default=1,
                   help="1: model.safetensors; more: that many shards and an index")
    p.add_argument("--tied", action="store_true", help="tie_word_embeddings (no lm_head.weight)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    for name in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "shards"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.hidden % a.heads or a.heads % a.kv_heads or (a.hidden // a.heads) % 2:
        p.error("--heads must divide --hidden into even head widths, --kv-heads must divide --heads")
    if a.shards > a.layers + 2:
        p.error("--shards must not exceed --layers + 2")
    return a


def shapes(a):
    d = a.hidden // a.heads
    out = {"model.embed_tokens.weight": [a.vocab, a.hidden], "model.norm.weight": [a.hidden]}
    if not a.tied:
        out["lm_head.weight"] = [a.vocab, a.hidden]
    for i in range(a.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = [a.hidden]
        out[p + "post_attention_layernorm.weight"] = [a.hidden]
        out[p + "self_attn.q_proj.weight"] = [a.heads * d, a.hidden]
        out[p + "self_attn.k_proj.weight"] = [a.kv_heads * d, a.hidden]
        out[p + "self_attn.v_proj.weight"] = [a.kv_heads * d, a.hidden]
        out[p + "self_attn.o_proj.weight"] = [a.hidden, a.heads * d]
        out[p + "mlp.gate_proj.weight"] = [a.ffn, a.hidden]
        out[p + "mlp.up_proj.weight"] = [a.ffn, a.hidden]
        out[p + "mlp.down_proj.weight"] = [a.hidden, a.ffn]
    return out


def encode(values, dtype):
    raw = struct.pack(f"<{len(values)}f", *values)
    if dtype == "F32":
        return raw
    # BF16: the upper half of each float32, rounded to nearest even.
    out = bytearray()
    for (bits,) in struct.iter_unpack("<I", raw):
        bits += 0x7FFF + ((bits >> 16) & 1)
        out += struct.pack("<H", (bits >> 16) & 0xFFFF)
    return bytes(out)


def write_safetensors(path, tensors, dtype):
    """tensors: {name: (shape, bytes)}; header keys sorted, padded to 8 bytes."""
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name in sorted(tensors):
        shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def draw_tensors(shapes_by_name, dtype, seed, is_norm):
    """{name: (shape, bytes)}: normal(0, 0.02) in sorted-name order, norms one."""
    rng = random.Random(seed)
    tensors = {}
    for name, shape in sorted(shapes_by_name.items()):
        n = 1
        for s in shape:
            n *= s
        values = [1.0] * n if is_norm(name) else [rng.gauss(0, 0.02) for _ in range(n)]
        tensors[name] = (shape, encode(values, dtype))
    return tensors


def write_checkpoint(out, tensors, dtype, shards):
    """model.safetensors, or `shards` files of contiguous sorted names and an index."""
    if shards == 1:
        write_safetensors(os.path.join(out, "model.safetensors"), tensors, dtype)
        return
    names = sorted(tensors)
    weight_map, total = {}, 0
    for k in range(shards):
        part = names[k * len(names) // shards:(k + 1) * len(names) // shards]
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(out, file), {n: tensors[n] for n in part}, dtype)
        for n in part:
            weight_map[n] = file
            total += len(tensors[n][1])
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def main():
    a = parse_args()
    os.makedirs(a.out, exist_ok=True)
    width = {"F32": 4, "BF16": 2}[a.dtype]
    tensors = draw_tensors(shapes(a), a.dtype, a.seed, lambda name: name.endswith("norm.weight"))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": a.hidden, "intermediate_size": a.ffn, "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
        "head_dim": a.hidden // a.heads, "vocab_size": a.vocab,
        "max_position_embeddings": a.max_positions, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "rope_scaling": None, "tie_word_embeddings": a.tied, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02,
        "torch_dtype": {"F32": "float32", "BF16": "bfloat16"}[a.dtype],
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    write_checkpoint(a.out, tensors, a.dtype, a.shards)
    params = sum(len(b) // width for _, b in tensors.values())
    print(f"make-hf-llama.py: {a.out}: {a.layers} layers, hidden {a.hidden}, {params} parameters, "
          f"{a.dtype}, {'one file' if a.shards == 1 else f'{a.shards} shards'}")


if __name__ == "__main__":
    sys.exit(main())

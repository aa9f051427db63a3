#!/usr/bin/env python3
"""Writes a small random T5 v1.1 / FLAN-T5 model as a Hugging Face checkpoint directory.

The directory holds what `transformers` writes for a FLAN-T5
`T5ForConditionalGeneration` (gated-GELU feed-forward, untied head):
config.json and either model.safetensors or --shards shard files named by
model.safetensors.index.json, in F32 or BF16. Nothing but the Python standard
library is used: the safetensors writer is make-hf-llama.py's, independent
of Varipipe's. With --embed-aliases the file also holds
encoder.embed_tokens.weight and decoder.embed_tokens.weight, the copies of
shared.weight that some T5 checkpoints store.

Weights: normal(0, 0.02) from Python's seeded generator, norms one; the draw
order is the tensors' sorted names.

Usage: make-hf-t5.py --out DIR [--layers 2] [--decoder-layers 2] [--hidden 64]
         [--heads 4] [--ffn 128] [--vocab 128] [--buckets 32] [--max-distance 128]
         [--dtype F32|BF16] [--shards N] [--embed-aliases] [--seed 1]
"""

import argparse
import importlib.util
import json
import os
import sys

_spec = importlib.util.spec_from_file_location(
    "make_hf_llama", os.path.join(os.path.dirname(os.path.abspath(__file__)), "make-hf-llama.py"))
_llama = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_llama)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory to create (or fill)")
    p.add_argument("--layers", type=int, default=2, help="encoder layers")
    p.add_argument("--decoder-layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=128)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--buckets", type=int, default=32)
    p.add_argument("--max-distance", type=int, default=128)
    p.add_argument("--dtype", choices=["F32", "BF16"], default="F32")
    p.add_argument("--shards", type=int, default=1,
                   help="1: model.safetensors; more: that many shards and an index")
    p.add_argument("--embed-aliases", action="store_true",
                   help="also write encoder.embed_tokens.weight and decoder.embed_tokens.weight")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    for name in ("layers", "decoder_layers", "hidden", "heads", "ffn", "vocab", "shards"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.hidden % a.heads:
        p.error("--heads must divide --hidden")
    if a.buckets < 4 or a.buckets % 2 or a.max_distance <= a.buckets // 2:
        p.error("--buckets must be even and at least 4, --max-distance above half of it")
    if a.shards > a.layers + a.decoder_layers + 4:
        p.error("--shards must not exceed the tensor groups")
    return a


def shapes(a):
    h, inner = a.hidden, a.hidden
    out = {"shared.weight": [a.vocab, h], "lm_head.weight": [a.vocab, h],
           "encoder.final_layer_norm.weight": [h], "decoder.final_layer_norm.weight": [h]}
    for stack, layers in (("encoder", a.layers), ("decoder", a.decoder_layers)):
        out[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = [
            a.buckets, a.heads]
        for i in range(layers):
            b = f"{stack}.block.{i}."
            out[b + "layer.0.layer_norm.weight"] = [h]
            for m in "qkv":
                out[b + f"layer.0.SelfAttention.{m}.weight"] = [inner, h]
            out[b + "layer.0.SelfAttention.o.weight"] = [h, inner]
            mlp = "layer.2." if stack == "decoder" else "layer.1."
            if stack == "decoder":
                out[b + "layer.1.layer_norm.weight"] = [h]
                for m in "qkv":
                    out[b + f"layer.1.EncDecAttention.{m}.weight"] = [inner, h]
                out[b + "layer.1.EncDecAttention.o.weight"] = [h, inner]
            out[b + mlp + "layer_norm.weight"] = [h]
            out[b + mlp + "DenseReluDense.wi_0.weight"] = [a.ffn, h]
            out[b + mlp + "DenseReluDense.wi_1.weight"] = [a.ffn, h]
            out[b + mlp + "DenseReluDense.wo.weight"] = [h, a.ffn]
    return out


def main():
    a = parse_args()
    os.makedirs(a.out, exist_ok=True)
    width = {"F32": 4, "BF16": 2}[a.dtype]
    tensors = _llama.draw_tensors(shapes(a), a.dtype, a.seed,
                                  lambda name: name.endswith("layer_norm.weight"))
    if a.embed_aliases:
        for alias in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
            tensors[alias] = tensors["shared.weight"]
    config = {
        "architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
        "d_model": a.hidden, "d_kv": a.hidden // a.heads, "d_ff": a.ffn,
        "num_layers": a.layers, "num_decoder_layers": a.decoder_layers, "num_heads": a.heads,
        "vocab_size": a.vocab, "relative_attention_num_buckets": a.buckets,
        "relative_attention_max_distance": a.max_distance, "layer_norm_epsilon": 1e-6,
        "feed_forward_proj": "gated-gelu", "dense_act_fn": "gelu_new", "is_gated_act": True,
        "tie_word_embeddings": False, "is_encoder_decoder": True, "decoder_start_token_id": 0,
        "pad_token_id": 0, "eos_token_id": 1, "dropout_rate": 0.1,
        "torch_dtype": {"F32": "float32", "BF16": "bfloat16"}[a.dtype],
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    _llama.write_checkpoint(a.out, tensors, a.dtype, a.shards)
    params = sum(len(b) // width for n, (_, b) in tensors.items() if "embed_tokens" not in n)
    print(f"make-hf-t5.py: {a.out}: {a.layers} + {a.decoder_layers} layers, hidden {a.hidden}, "
          f"{params} parameters, {a.dtype}, "
          f"{'one file' if a.shards == 1 else f'{a.shards} shards'}")


if __name__ == "__main__":
    sys.exit(main())

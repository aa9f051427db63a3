#!/usr/bin/env python3
"""Golden files from Hugging Face `transformers` for the CPU tests.

Builds tiny random models of the families Varipipe maps to Hugging Face
(Llama, with and without tied embeddings and with grouped-query attention,
and FLAN-T5, i.e. T5 v1.1 with gated-GELU feed-forward and untied head),
saves each with `save_pretrained` (config.json and model.safetensors) and,
next to it, golden.safetensors holding what one forward and backward pass of
`transformers` computes on fixed token ids, in fp32 on the CPU with eager
attention:

  input_ids, labels (int64), and for T5 decoder_input_ids
  logits   [batch, length, vocab] fp32
  loss     [] fp32 (the model's own mean cross-entropy over the labels)
  grad_norm/<parameter name>  [] fp32: each parameter's gradient L2 norm

and golden.json with the same scalars, the versions used and the command.
The machine needs only torch, transformers and safetensors (the GPU machine
of docs/gpu.md has them; run-on-gpu.sh's check hf-goldens runs this).

With --check-export DIR it instead loads a Varipipe export (a Hugging Face
directory written by varipipe-executor --export_hf, e.g. tests/data/hf/
varipipe-export or varipipe-t5-export) with LlamaForCausalLM or, for
model_type "t5", T5ForConditionalGeneration .from_pretrained, reports missing,
unexpected and mismatched keys, and compares its loss on --golden's token ids
(and T5's labels) with the golden loss (the export holds the golden model's
weights). It compares the configs too: with --source (the checkpoint the job
started from, training.init_from) config.json field by field, all equal but
the dtype, and the tokenizer and generation files byte for byte; with only
--golden the values serving stacks read (context length, special tokens,
vocabulary) as transformers loads both configs.

Usage: hf_goldens.py --out DIR [--seed N]
       hf_goldens.py --check-export DIR --golden tests/data/hf/llama-tiny
       hf_goldens.py --check-export DIR --golden tests/data/hf/flan-t5-tiny
       hf_goldens.py --check-export DIR --source INIT_FROM [--golden ...]
"""

import argparse
import json
import os
import sys


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="folder to write one subfolder per model into")
    p.add_argument("--check-export", help="a Varipipe export to load with from_pretrained")
    p.add_argument("--golden", help="with --check-export: the golden folder it was exported from")
    p.add_argument("--source", help="with --check-export: the checkpoint the job started from "
                   "(training.init_from), whose config.json and tokenizer the export carries")
    p.add_argument("--seed", type=int, default=1234, help="seed of the weights and token ids")
    return p.parse_args()


def llama(transformers, tied):
    cfg = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tied,
        attention_bias=False, mlp_bias=False, hidden_act="silu")
    try:
        cfg._attn_implementation = "eager"  # the reference math, not a fused kernel
    except AttributeError:
        pass
    return transformers.LlamaForCausalLM(cfg)


def flan_t5(transformers):
    cfg = transformers.T5Config(
        vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
        num_heads=4, relative_attention_num_buckets=32, relative_attention_max_distance=128,
        dropout_rate=0.0, layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu",
        tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = transformers.T5ForConditionalGeneration(cfg)
    # transformers 5.17 kept the head tied to the embedding although the
    # config asked otherwise (its saved config said tie_word_embeddings true):
    # untie it, as FLAN-T5 is, with the embedding's values.
    import torch
    if model.lm_head.weight.data_ptr() == model.shared.weight.data_ptr():
        model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())
    model.config.tie_word_embeddings = False
    return model


# What an export started from a checkpoint copies from it (hf_export_config.h).
MODEL_FILES = ["generation_config.json", "tokenizer.model", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json"]
DTYPE_KEYS = {"dtype", "torch_dtype"}
# What serving stacks read from config.json besides the shapes.
SERVING_KEYS = {
    "llama": ["max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
              "vocab_size", "tie_word_embeddings"],
    "t5": ["decoder_start_token_id", "eos_token_id", "pad_token_id", "vocab_size"],
}


def read_json(folder, name="config.json"):
    with open(os.path.join(folder, name)) as f:
        return json.load(f)


def config_differences_from_source(export, source):
    """config.json field by field (the dtype aside) and the copied files."""
    got, want = read_json(export), read_json(source)
    problems = []
    for key, value in want.items():
        if key in DTYPE_KEYS:
            continue
        if key not in got:
            problems.append(f"config.json: {key} is missing (the source has {value!r})")
        elif got[key] != value:
            problems.append(f"config.json: {key} is {got[key]!r}, the source has {value!r}")
    allowed = DTYPE_KEYS if not (DTYPE_KEYS & set(want)) else set(want)
    for key in set(got) - set(want) - allowed:
        problems.append(f"config.json: {key} is not in the source")
    for name in MODEL_FILES:
        if not os.path.exists(os.path.join(source, name)):
            continue
        path = os.path.join(export, name)
        if not os.path.exists(path):
            problems.append(f"{name} was not copied")
            continue
        with open(path, "rb") as a, open(os.path.join(source, name), "rb") as b:
            if a.read() != b.read():
                problems.append(f"{name} differs from the source's")
    return problems


def config_differences_from_golden(export, golden, config_class, model_type):
    """The values serving stacks read, as transformers loads both configs."""
    got = config_class.from_pretrained(export)
    want = config_class.from_pretrained(golden)
    problems = []
    for key in SERVING_KEYS[model_type]:
        a, b = getattr(got, key, None), getattr(want, key, None)
        if a != b:
            problems.append(f"config.json: {key} is {a!r}, the golden's is {b!r}")
    return problems


def check_configs(args, cls, t5):
    if args.source:
        problems = config_differences_from_source(args.check_export, args.source)
        against = f"the source {args.source}"
    elif args.golden:
        problems = config_differences_from_golden(
            args.check_export, args.golden, cls.config_class, "t5" if t5 else "llama")
        against = f"the golden {args.golden}"
    else:
        return []
    for p in problems:
        print(f"NOTE config: {p}")
    print(f"NOTE export's config against {against}: "
          + (f"{len(problems)} difference(s)" if problems else "no differences"))
    return problems


def check_export(args):
    import safetensors.torch
    import torch
    import transformers
    with open(os.path.join(args.check_export, "config.json")) as f:
        t5 = json.load(f).get("model_type") == "t5"
    cls = transformers.T5ForConditionalGeneration if t5 else transformers.LlamaForCausalLM
    try:  # transformers 5 names it dtype, earlier versions torch_dtype
        model, info = cls.from_pretrained(
            args.check_export, output_loading_info=True, dtype=torch.float32)
    except TypeError:
        model, info = cls.from_pretrained(
            args.check_export, output_loading_info=True, torch_dtype=torch.float32)
    problems = {k: sorted(v) for k, v in info.items() if v}
    print(f"NOTE {cls.__name__}.from_pretrained({args.check_export}): "
          + ("no missing, unexpected or mismatched keys" if not problems else str(problems)))
    if check_configs(args, cls, t5):
        problems["config"] = True
    if not args.golden:
        return 1 if problems else 0
    golden = safetensors.torch.load_file(os.path.join(args.golden, "golden.safetensors"))
    model.eval()
    with torch.no_grad():
        loss = float(model(input_ids=golden["input_ids"], labels=golden["labels"]).loss)
    want = float(golden["loss"])
    rel = abs(loss - want) / want
    print(f"NOTE export's loss {loss:.7f} against the golden {want:.7f} (relative {rel:.2e})")
    return 1 if problems or rel > 1e-6 else 0


def main():
    args = parse_args()
    if args.check_export:
        sys.exit(check_export(args))
    if not args.out:
        sys.exit("hf_goldens.py: --out or --check-export is required")
    try:
        import safetensors
        import safetensors.torch
        import torch
        import transformers
    except ImportError as e:
        sys.exit(f"hf_goldens.py: {e} (needs torch, transformers and safetensors)")
    os.makedirs(args.out, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "safetensors": getattr(safetensors, "__version__", "unknown")}
    models = {
        "llama-tiny": lambda: llama(transformers, tied=False),
        "llama-tiny-tied": lambda: llama(transformers, tied=True),
        "flan-t5-tiny": lambda: flan_t5(transformers),
    }
    failed = []
    for name, build in models.items():
        try:
            golden(name, build, args, versions, torch, safetensors)
        except Exception as e:  # one model's failure must not hide the others
            print(f"NOTE {name}: failed: {type(e).__name__}: {e}")
            failed.append(name)
    if failed:
        sys.exit(f"hf_goldens.py: failed for {', '.join(failed)}")


def golden(name, build, args, versions, torch, safetensors):
    """Writes DIR/name: the model, golden.safetensors and golden.json."""
    torch.manual_seed(args.seed)
    model = build().float().eval()  # eval: no dropout; gradients still flow
    gen = torch.Generator().manual_seed(args.seed + 1)
    vocab = model.config.vocab_size
    batch, length = 2, 12
    # Ids from 2 up: 0 and 1 are T5's pad and end tokens.
    input_ids = torch.randint(2, vocab, (batch, length), generator=gen)
    tensors = {"input_ids": input_ids}
    if name.startswith("flan-t5"):
        labels = torch.randint(2, vocab, (batch, 8), generator=gen)
        out = model(input_ids=input_ids, labels=labels)
        # What T5 feeds its decoder: the labels shifted right after the
        # decoder start token.
        tensors["decoder_input_ids"] = model._shift_right(labels)
    else:
        labels = input_ids.clone()  # LlamaForCausalLM shifts them itself
        out = model(input_ids=input_ids, labels=labels)
    out.loss.backward()
    tensors["labels"] = labels
    tensors["logits"] = out.logits.detach().float().contiguous()
    tensors["loss"] = out.loss.detach().float().reshape(())
    norms = {}
    for pname, p in model.named_parameters():
        if p.grad is None:
            continue
        norms[pname] = float(p.grad.detach().float().norm())
        tensors[f"grad_norm/{pname}"] = p.grad.detach().float().norm().reshape(())
    folder = os.path.join(args.out, name)
    model.save_pretrained(folder, safe_serialization=True)
    safetensors.torch.save_file({k: v.contiguous() for k, v in tensors.items()},
                                os.path.join(folder, "golden.safetensors"))
    with open(os.path.join(folder, "golden.json"), "w") as f:
        json.dump({"model": name, "seed": args.seed, "versions": versions,
                   "command": "deploy/gpu/hf_goldens.py --out DIR --seed %d" % args.seed,
                   "loss": float(out.loss), "parameters": sum(p.numel() for p in model.parameters()),
                   "grad_norms": norms}, f, indent=1, sort_keys=True)
    print(f"NOTE {name}: loss {float(out.loss):.6f}, "
          f"{sum(p.numel() for p in model.parameters())} parameters, {len(norms)} gradient norms")


if __name__ == "__main__":
    main()

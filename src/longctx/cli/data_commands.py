"""`longctx prepare` (tokenise a corpus into litdata) and `longctx fi` (a dataset's f(i),
STRING Figure 1, without training)."""

from __future__ import annotations

import argparse
from pathlib import Path

from longctx.errors import DataError


def _is_sharded(sources: list[str]) -> bool:
    """Several sources, or one naming shards (data/shard_reader.py's one rule), rather than one
    of data/corpus.py's bundled sources (embedded, debian:PACKAGE, a directory of text files)."""
    from longctx.data.shard_reader import is_shard_source

    return len(sources) != 1 or is_shard_source(sources[0])


def _shard_suffixes() -> str:
    from longctx.data.shard_reader import SHARD_SUFFIXES

    return ", ".join(SHARD_SUFFIXES)


def cmd_prepare(args: argparse.Namespace) -> int:
    from longctx.data.prepare import prepare

    if args.verify:
        return verify_prepared(args.verify)
    if args.join:
        from longctx.data.sharded_prepare import join_parts

        join_parts(args.join, args.nodes)
        return 0
    if len(args.paths) < 2:
        raise DataError("longctx prepare needs SRC... OUT_DIR (or --verify DIR, or --join OUT_DIR --nodes N)")
    *sources, out_dir = args.paths
    if _is_sharded(sources):
        from longctx.data.sharded_prepare import prepare_shards

        keep = _metadata_filter(args)
        prepare_shards(
            sources,
            out_dir,
            args.tokenizer,
            text_key=args.text_key,
            keep=keep,
            on_bad_input=args.on_bad_input,
            num_workers=args.workers,
            node_rank=args.node_rank,
            nodes=args.nodes,
            chunk_bytes=args.chunk_bytes,
        )
        return 0
    shard_only = {"--keep": args.keep, "--drop": args.drop, "--node-rank": args.node_rank, "--nodes": args.nodes > 1}
    if given := [flag for flag, value in shard_only.items() if value]:
        raise DataError(f"{' '.join(given)} apply to sharded corpora ({_shard_suffixes()}), not {sources[0]!r}")
    prepare(sources[0], out_dir, args.tokenizer, num_workers=args.workers, chunk_bytes=args.chunk_bytes)
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


def _metadata_filter(args: argparse.Namespace):
    from longctx.data.shard_reader import MetadataFilter

    if args.keep and args.drop:
        raise DataError("--keep and --drop: give one metadata filter")
    if args.keep or args.drop:
        return MetadataFilter.parse(args.keep or args.drop, keep=bool(args.keep))
    return None


def cmd_sampled_fi(args: argparse.Namespace) -> int:
    from longctx.probes.sampled_fi import sampled_fi, write_sampled

    if not _is_sharded(args.data):
        raise DataError(f"--sample reads shards ({_shard_suffixes()}); {args.data} holds none")
    result = sampled_fi(
        args.data,
        args.tokenizer,
        args.window,
        args.sample,
        args.seed,
        text_key=args.text_key,
        keep=_metadata_filter(args),
        on_bad_input=args.on_bad_input,
        replicates=args.bootstrap,
    )
    if result.counts.rejected:
        print(result.counts.summary())
    for line in result.summary_lines():
        print(line)
    numbers, figure = write_sampled(result, args.out)
    print(f"wrote {numbers} and {figure}")
    return 0


def cmd_fi(args: argparse.Namespace) -> int:
    import numpy as np

    from longctx.probes.dataset_fi import document_lengths, figure1_frequencies, packed_rows_fi, write_outputs

    if args.sample is not None:
        return cmd_sampled_fi(args)
    if len(args.data) != 1:
        raise DataError(
            f"longctx fi counts one dataset or source at a time (got {len(args.data)}); --sample reads several"
        )
    args.data = args.data[0]
    lengths = document_lengths(
        args.data,
        args.tokenizer,
        text_key=args.text_key,
        keep=_metadata_filter(args),
        on_bad_input=args.on_bad_input,
    )
    result = figure1_frequencies(lengths, args.window)
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
        Path(args.out).mkdir(parents=True, exist_ok=True)
        np.save(Path(args.out) / f"fi_{args.transform}_L{args.window}_T{target}.npy", curve)
    for line in result.summary_lines():
        print(line)
    window = _sliding_window(args)
    if window:
        # The documents' ids are consecutive, so a sliding layer's f_W is f below W
        # (probes/sliding_frequency.py); the full layers alone train i >= W.
        for name in list(result.frequency):
            curve = result.frequency[name]
            result.frequency[f"{name}, sliding W={window}"] = np.where(np.arange(len(curve)) < window, curve, 0)
            beyond = curve[window:].sum() / curve.sum() if curve.sum() else 0.0
            print(f"{name:>12}: {100 * beyond:.1f}% of pairs at i >= W={window}, trained by the full layers only")
    numbers, figure = write_outputs(result, args.out)
    print(f"wrote {numbers} and {figure}")
    return 0


def _sliding_window(args: argparse.Namespace) -> int:
    """W of the model's sliding layers: --sliding-window, or the --config file's model when
    any of its layers slides; 0 without sliding layers."""
    if args.sliding_window:
        return args.sliding_window
    if not args.config:
        return 0
    from longctx.config import load

    model = load([args.config]).model
    return model.sliding_window if "sliding" in model.layer_kinds() else 0


def _add_record_options(parser: argparse.ArgumentParser) -> None:
    """How records of shards are read (data/shard_reader.py): shared by prepare and fi."""
    parser.add_argument("--text-key", default="text", help="the records' text field (dotted for nested)")
    parser.add_argument(
        "--keep", metavar="KEY=V[,V...]", help="keep only records whose KEY (e.g. meta.redpajama_set_name) is a V"
    )
    parser.add_argument(
        "--drop",
        metavar="KEY=V[,V...]",
        help="drop records whose KEY is a V (SlimPajama without GitHub: --drop meta.redpajama_set_name=RedPajamaGithub)",
    )
    parser.add_argument(
        "--on-bad-input",
        choices=("error", "skip"),
        default="error",
        help="a bad line, record or shard: stop naming shard and line (error), or skip it, count it and report "
        "where it was (prepare's manifest, fi's output)",
    )


def register(commands: argparse._SubParsersAction) -> None:
    prep = commands.add_parser("prepare", help="tokenise a corpus into a litdata-optimized dataset")
    prep.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="SRC... OUT: sources, then the output directory (or s3:// prefix). A source is a shard (a format of "
        "data/shard_reader.py's table: .jsonl, .jsonl.gz, .jsonl.zst, .parquet), "
        "a directory searched recursively for shards, a quoted glob ('c/**/*.parquet'); "
        "or one of embedded | embedded:code | debian:PACKAGE | a directory of .txt/.md/.rst files",
    )
    prep.add_argument(
        "--verify", metavar="DIR", help="check a prepared dataset: every chunk's size and SHA-256 (nothing is written)"
    )
    prep.add_argument("--tokenizer", default="bpe-8192", help="bpe-8192 | llama3 | cl100k | path to tokenizer.json")
    prep.add_argument("--workers", type=int, default=1, help="litdata worker processes")
    prep.add_argument("--chunk-bytes", default="64MB", help="litdata chunk size")
    _add_record_options(prep)
    prep.add_argument("--node-rank", type=int, default=0, help="this node, of --nodes: it takes every N-th shard")
    prep.add_argument("--nodes", type=int, default=1, help="nodes preparing the corpus together (then --join)")
    prep.add_argument("--join", metavar="OUT", help="merge the --nodes parts under OUT/parts into the dataset OUT")
    prep.set_defaults(run=cmd_prepare)
    fi = commands.add_parser("fi", help="f(i) and document lengths of a dataset (STRING Figure 1), no training")
    fi.add_argument(
        "data",
        nargs="+",
        help="prepared dataset directory, or one source as `longctx prepare` reads it (a shard, a directory or "
        "glob of shards, embedded, debian:PACKAGE, a directory of text files); --sample reads shards only, "
        "several sources at once",
    )
    fi.add_argument("--window", type=int, required=True, help="training length L")
    fi.add_argument("--tokenizer", default="bpe-8192", help="for corpus sources that are not prepared")
    fi.add_argument("--doc-mask", choices=("true", "false"), help="also count one epoch of packed rows in this mode")
    fi.add_argument(
        "--transform", choices=("pose", "randpos"), help="also count natural pieces under these position ids"
    )
    fi.add_argument("--target-length", type=int, default=0, help="the transform's target length (default 4 x window)")
    fi.add_argument("--out", default="runs/fi", help="where the PNG and the numbers go")
    fi.add_argument("--sliding-window", type=int, default=0, help="also f_W, what sliding layers of window W train")
    fi.add_argument("--config", help="an experiment YAML: its model's layer pattern gives --sliding-window")
    fi.add_argument(
        "--sample",
        type=float,
        metavar="FRACTION",
        help="estimate f(i) and the length histogram from this fraction of the documents, drawn uniformly at "
        "random and scaled by 1/FRACTION, with a bootstrap 95%% interval (a corpus too large to tokenise)",
    )
    fi.add_argument("--seed", type=int, default=0, help="--sample's draw (and its bootstrap)")
    fi.add_argument("--bootstrap", type=int, default=200, help="--sample's bootstrap replicates")
    _add_record_options(fi)
    fi.set_defaults(run=cmd_fi)

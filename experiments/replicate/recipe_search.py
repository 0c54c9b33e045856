"""CPU recipe search for a retrieving miniature (docs/replication_log.md, the search sessions).

A bare training loop (no Lightning, one thread) over retrieval documents, one document per
row padded to the longest in the batch, loss on every token; every `--eval-every` steps
the held-out answer metrics of probes/retrieval_answers.py. Prints one JSON line per eval.

python experiments/replicate/recipe_search.py --facts 2 --queries 2 --filler-max 2 --steps 3000
"""

import argparse
import dataclasses
import json
import math
import time

import torch
import torch.nn.functional as F

from longctx.config import ExperimentConfig, NiahConfig
from longctx.config.data import RetrievalConfig
from longctx.config.model import ModelConfig
from longctx.data.packing import contract_from_blocks
from longctx.data.retrieval import filler_sentences, make_document
from longctx.data.tokenizer import load_tokenizer
from longctx.eval.niah.evaluation import evaluate
from longctx.eval.niah.haystack import Haystack
from longctx.model.llama import Llama
from longctx.probes.retrieval_answers import answer_metrics

parser = argparse.ArgumentParser()
parser.add_argument("--facts", type=int, default=2)
parser.add_argument("--queries", type=int, default=2)
parser.add_argument("--list-query", action="store_true")
parser.add_argument("--filler-min", type=int, default=0)
parser.add_argument("--filler-max", type=int, default=2)
parser.add_argument("--digits", type=int, default=5)
parser.add_argument("--digits-max", type=int, default=0)
parser.add_argument("--template", default="inventory")
parser.add_argument("--niah-lengths", default="", help="comma-separated NIAH (paper task) lengths to test")
parser.add_argument("--niah-tests", type=int, default=20)
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--decay", choices=("all", "matrices"), default="all", help="weight decay on every parameter or on >= 2-D ones (the trainer's)")
parser.add_argument("--eos", action="store_true", help="end every document with EOS (as prepared data does)")
parser.add_argument("--rows-from", default="", help="a prepared dataset: train on its documents-packing rows (the trainer's)")
parser.add_argument("--drop-pieces", action="store_true", help="with --rows-from: skip rows holding a piece of a longer document")
parser.add_argument("--first-document", type=int, default=0, help="index of the first training document")
parser.add_argument("--packed", action="store_true", help="pack documents + EOS into rows of --window (doc mask)")
parser.add_argument("--window", type=int, default=192)
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--steps", type=int, default=3000)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--warmup", type=int, default=100)
parser.add_argument("--d-model", type=int, default=128)
parser.add_argument("--layers", type=int, default=2)
parser.add_argument("--eval-every", type=int, default=250)
parser.add_argument("--minutes", type=float, default=1e9)
parser.add_argument("--save", default="")
args = parser.parse_args()

torch.set_num_threads(args.threads)
torch.manual_seed(args.seed)
tokenizer = load_tokenizer("bpe-512")
retrieval = RetrievalConfig(
    documents=10**9,
    facts=args.facts,
    queries=args.queries,
    list_query=args.list_query,
    filler_min=args.filler_min,
    filler_max=args.filler_max,
    value_digits=args.digits,
    value_digits_max=args.digits_max,
    template=args.template,
)
niah_lengths = [int(length) for length in args.niah_lengths.split(",") if length]
haystack = Haystack.paul_graham(tokenizer) if niah_lengths else None
niah = NiahConfig(tests_per_length=args.niah_tests, max_new_tokens=40)
model = Llama(
    ModelConfig(
        vocab_size=512,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=4,
        n_kv_heads=4,
        d_ff=4 * args.d_model,
        max_position=max(512, args.window, *niah_lengths),
        attention_backend="varlen" if args.packed or args.rows_from else "sdpa",
    )
)
if args.decay == "all":
    groups = [{"params": list(model.parameters()), "weight_decay": 0.1}]
else:
    groups = [
        {"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0},
    ]
optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))
filler = filler_sentences()
index = args.first_document
stream: list[int] = []
trainer_rows = None
if args.rows_from:
    from longctx.data.packing import PackedRows, PackedSource

    source = PackedSource(args.rows_from, seed=args.seed)
    trainer_rows = iter(
        PackedRows([source], [1.0], window=args.window, eos_id=tokenizer.eos_id, doc_mask=True, packing="documents")
    )
    if args.drop_pieces:
        from longctx.data.packing import pad_documents_row

        table = source.document_rows(0, args.window + 1)
        whole = [r for r in range(len(table)) if table[r, 2] < 0]
        trainer_rows = (
            pad_documents_row(source.read_row(r, args.window + 1), args.window + 1, tokenizer.eos_id, True)
            for r in whole
        )
start = time.time()
for step in range(1, args.steps + 1):
    if trainer_rows is not None:
        taken = [next(trainer_rows) for _ in range(args.batch)]
        inputs, labels, positions, documents = (
            torch.stack([row[key] for row in taken]) for key in ("input_ids", "labels", "position_ids", "document_ids")
        )
    elif args.packed:
        while len(stream) < args.batch * (args.window + 1):
            stream += [*tokenizer.encode(make_document(retrieval, index, filler).text), tokenizer.eos_id]
            index += 1
        take = args.batch * (args.window + 1)
        blocks, stream = torch.tensor(stream[:take]).view(args.batch, args.window + 1), stream[take:]
        packed = contract_from_blocks(blocks, tokenizer.eos_id, True)
        inputs, labels = packed["input_ids"], packed["labels"]
        positions, documents = packed["position_ids"], packed["document_ids"]
    rows = []
    while not args.packed and trainer_rows is None and len(rows) < args.batch:
        ids = tokenizer.encode(make_document(retrieval, index, filler).text) + ([tokenizer.eos_id] if args.eos else [])
        index += 1
        if len(ids) <= args.window + 1:
            rows.append(ids)
    length = max(map(len, rows), default=0)
    batch = torch.full((len(rows), length), -100)
    for i, ids in enumerate(rows):
        batch[i, : len(ids)] = torch.tensor(ids)
    if not args.packed and trainer_rows is None:
        inputs, labels = batch[:, :-1].clamp(min=0), batch[:, 1:]
        positions = documents = None
    lr = args.lr * min(1.0, step / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
    for group in optimizer.param_groups:
        group["lr"] = lr
    model.train()
    loss = F.cross_entropy(model(inputs, positions, documents).flatten(0, 1), labels.flatten(), ignore_index=-100)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    out_of_time = time.time() - start > args.minutes * 60
    if step % args.eval_every == 0 or step == args.steps or out_of_time:
        metrics = answer_metrics(model, tokenizer, retrieval, args.window, documents=32)
        model.eval()
        passes = {}
        if niah_lengths:
            settings = dataclasses.replace(niah, lengths=niah_lengths)
            for row in evaluate(model, ExperimentConfig(), tokenizer, haystack, settings=settings).per_length:
                passes[row.length] = f"{row.passed}/{row.tests} recall {row.recall:.2f}"
                passes[f"out{row.length}"] = row.example_output[:60]
        print(
            json.dumps(
                {
                    "step": step,
                    "wall_s": round(time.time() - start),
                    "train_loss": round(loss.item(), 3),
                    "answer_loss": round(metrics["answer_loss"], 3),
                    "value_exact": metrics["value_exact"],
                    "answers": metrics["answers"],
                    "docs_seen": index,
                    "niah": passes,
                }
            ),
            flush=True,
        )
    if out_of_time:
        break
if args.save:
    torch.save(model.state_dict(), args.save)

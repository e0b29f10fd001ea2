# Every target sets up .venv itself when needed. torch==2.13.0 is installed first: it is the local CPU
# build, and installing it before the package keeps pip from pulling a CUDA build for `torch>=2.5`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip --quiet --disable-pip-version-check

.PHONY: setup demo test bench multi30k notebooks lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[torch,keras,plot,app,export,serve,ray,dev]'
	touch $(STAMP)

# The main job: train the dates task (resuming runs/dates if it is there), translate three examples, plot.
demo: $(STAMP)
	$(BIN)/multihead demo --out runs/dates

# The whole suite runs on Keras' default TensorFlow backend, then the Keras tests run again on its torch and JAX
# backends.
test: lint $(STAMP)
	$(BIN)/python -m pytest
	KERAS_BACKEND=torch $(BIN)/python -m pytest -m keras
	KERAS_BACKEND=jax $(BIN)/python -m pytest -m keras

# Our attention against its peers, and generation with and without the cache (about 33 minutes on 2 cores);
# writes benchmarks/results.{json,md,png}.
bench: $(STAMP)
	$(BIN)/multihead bench --out benchmarks

# Multi30k German→English (docs/translation.md): 30 minutes of training with the corpus recipe (skipped when
# $(RUN) already holds a run), then sacreBLEU on test_2016_flickr, greedy and beam 4. DATA holds Multi30k's task-1
# files as distributed: {train,val,test_2016_flickr}.{de,en}.gz.
DATA ?= ../shared/data/multi30k
RUN ?= runs/multi30k
multi30k: $(STAMP)
	test -d $(RUN) || $(BIN)/multihead train --data $(DATA)/train.de.gz $(DATA)/train.en.gz \
		--valid $(DATA)/val.de.gz $(DATA)/val.en.gz --out $(RUN) --minutes 30
	$(BIN)/multihead evaluate $(RUN) $(DATA)/test_2016_flickr.de.gz $(DATA)/test_2016_flickr.en.gz
	$(BIN)/multihead evaluate $(RUN) $(DATA)/test_2016_flickr.de.gz $(DATA)/test_2016_flickr.en.gz --beam 4

# The tutorials as notebooks, generated from their jupytext scripts (never edit the .ipynb files by hand).
notebooks: $(STAMP)
	$(BIN)/jupytext --to ipynb docs/tutorial.py docs/tutorial.zh-CN.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks docs
	$(BIN)/ruff format --check src tests benchmarks docs
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix src tests benchmarks docs
	$(BIN)/ruff format src tests benchmarks docs

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis

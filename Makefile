# coretrain — developer entry points. `make train` and `make test` are the quick start.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DATA   ?= data/demo
OUTPUT ?= output
# Demo training length: long enough to beat the mean predictor clearly,
# short enough for a 2-core machine (see README "Quick start").
DEMO_TRAIN_ARGS ?= --max-steps 200 --eval-every 50 --checkpoint-every 100

.PHONY: install train test test-fast lint typecheck unit bench lock container-test mutation mutation-report clean

$(BIN)/coretrain: pyproject.toml constraints.txt setup.py app/data/formats/textfile/_fastparse.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]'
	@touch $@

install: $(BIN)/coretrain

$(DATA)/train_features.txt: | $(BIN)/coretrain
	$(BIN)/coretrain generate --out $(DATA)

train: install $(DATA)/train_features.txt
	$(BIN)/coretrain train --data $(DATA) --output $(OUTPUT) $(DEMO_TRAIN_ARGS)

lint: install
	$(BIN)/ruff check app tests benchmarks tools
	$(BIN)/ruff format --check app tests benchmarks tools
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest -q

test: lint typecheck unit

# The fast loop while editing (~4 minutes on 2 cores): lint, types, the layer contracts and
# every test not marked slow (those that train TensorFlow in a subprocess). Not a substitute
# for make test, which CI runs.
test-fast: lint typecheck
	$(BIN)/pytest -q -m "not slow"

bench: install
	$(BIN)/python -m benchmarks.run

# requirements.lock, what the image installs (sha256 of every wheel, for x86_64 and aarch64),
# from pyproject.toml and constraints.txt: run after changing either (docs/deploy.md "Build").
lock: install
	$(BIN)/python tools/lock_requirements.py

# Mutation testing of app/budget/ and the text parser (mutmut 3; not in CI: long, ~1 s per mutant on
# 2 cores). Survivors: `$(BIN)/mutmut results`; one mutant: `$(BIN)/mutmut show NAME`.
MUTATION_EXAMPLES ?= 40
mutation: install
	$(BIN)/pip install --quiet -c constraints.txt -e '.[mutation]'
	CORETRAIN_HYPOTHESIS_EXAMPLES=$(MUTATION_EXAMPLES) $(BIN)/mutmut run
	$(BIN)/mutmut results

# docs/mutation.md from the last `make mutation` in this checkout: counts per module and the
# reason each mutant not killed is left (tools/mutation_reasons.tsv; ~3 minutes).
mutation-report:
	$(BIN)/python tools/mutation_report.py

container-test:
	bash tests/container/smoke.sh

clean:
	rm -rf $(VENV) $(OUTPUT) build *.egg-info

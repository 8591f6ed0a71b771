# `make demo` and `make test` work on a fresh machine with Python >= 3.11, pip and make.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=
# Test processes (pytest-xdist), each taking whole test modules (--dist loadfile): the
# suite waits on child processes, servers and Ray as much as it computes. 1: no workers.
TEST_WORKERS ?= 2
PYTEST_PARALLEL := $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile,-p no:xdist)

.PHONY: demo test test-all test-fast fuzz lint check-size format bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Stamp files re-run the install when pyproject.toml changes.
$(VENV)/.demo-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[bench,cli,plot]'
	touch $@

$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.demo-installed

demo: $(VENV)/.demo-installed
	$(BIN)/lifecycle soak --plot soak.png

# Wheels, archives and data sets stay out of git: no tracked (staged) file over
# 1 MB, except images for the docs.
MAX_FILE_BYTES := 1000000

check-size:
	@git rev-parse --git-dir >/dev/null 2>&1 || exit 0; \
	big=$$(git -c core.quotepath=off ls-files -s \
	  | awk -F '\t' '{ split($$1, meta, " "); print meta[2], $$2 }' \
	  | git cat-file --batch-check='%(objectsize) %(rest)' \
	  | awk -v max=$(MAX_FILE_BYTES) '$$1 > max { name = substr($$0, length($$1) + 2); \
	      if (name !~ /^docs\/images\//) print "  " name " (" $$1 " bytes)" }'); \
	if [ -n "$$big" ]; then \
	  printf '%s\n%s\n' "Tracked files over 1 MB outside docs/images/ (git rm them):" "$$big"; \
	  exit 1; \
	fi

# lint-imports: the layers of docs/internals.md ([tool.importlinter] in pyproject.toml).
lint: check-size $(VENV)/.dev-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# The benchmark scripts' end-to-end runs (marker `benchmark`) are left out of
# `make test`; one cheap run through the harness's child processes stays in.
# A `-m` in PYTEST_ARGS comes last and replaces the target's own.
test: lint
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "not benchmark" $(PYTEST_ARGS)

# Everything, the benchmark scripts' end-to-end runs included.
test-all: lint
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)

# The fast lane: the slow tests left out, one test of every kind kept.
test-fast: lint
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "not slow and not benchmark" $(PYTEST_ARGS)

# The fuzzing suite's long run: every decoder of `lifecycle serve` driven with
# FUZZ_EXAMPLES random inputs each (`make test` runs 150, the same on every machine).
FUZZ_EXAMPLES ?= 20000
fuzz: $(VENV)/.dev-installed
	LIFECYCLE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -p no:xdist \
	  tests/test_server_fuzz.py tests/test_server_json.py $(PYTEST_ARGS)

format: $(VENV)/.dev-installed
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(VENV)/.demo-installed
	$(BIN)/python benchmarks/loop_training.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .import_linter_cache *.egg-info

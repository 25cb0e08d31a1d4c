# Two set-up commands on a fresh machine (python3 + network to the package index):
#   make demo   install the fork into .venv, serve a tiny Gemma-4 on CPU, talk to it (OpenAI API)
#   make test   install the fork into .venv, check every step of the stacks, run the CPU suite
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
# Test processes at once: the per-step check's worktrees and the suite's pytest-xdist
# workers. A test mostly keeps one core busy, so the default is the CI machine's 2 cores.
JOBS ?= 2

.PHONY: demo test install check export clean

$(VENV)/.deps: requirements-cpu.txt
	@$(PY) tools/check_env.py
	@echo "[phase] dependencies: creating $(VENV) (takes minutes on a fresh machine)"
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --no-cache-dir --upgrade pip || { echo "error: pip could not reach the package index (check network/proxy)"; exit 1; }
	$(VPY) -m pip install -q --no-cache-dir -r requirements-cpu.txt || { echo "error: installing requirements-cpu.txt failed (see pip's message above; is the package index reachable?)"; exit 1; }
	touch $@

install: $(VENV)/.deps
	@$(PY) tools/phase.py install $(PY) tools/fork.py install --venv $(VENV) --no-deps-check

# Every step of patches/series applies, imports and passes its own tests; then the
# whole suite runs against the installed fork (the last step).
test: install
	@$(PY) tools/phase.py per-step-check $(PY) tools/fork.py check --each --jobs $(JOBS) --python $(VPY)
	@$(PY) tools/phase.py suite $(VPY) -m pytest test/srt test/bench test/tools -q -p no:cacheprovider -n $(JOBS) --dist loadfile --no-loadscope-reorder

demo: install
	$(VPY) scripts/demo.py

check:
	$(PY) tools/fork.py check

export:
	$(PY) tools/fork.py export build/export --force

clean:
	rm -rf build $(VENV)

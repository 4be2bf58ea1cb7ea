# make setup | make demo | make test   (needs python3.11, node 20, npm, and the package registries)
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
PYTEST_ARGS ?=

.PHONY: setup demo test clean

setup: $(VENV)/.installed node_modules/.package-lock.json

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch goes first and alone, pinned, so no resolver run can ever pick another torch.
$(VENV)/.installed: requirements.lock pyproject.toml | $(PY)
	$(PIP) install --no-deps torch==2.13.0
	$(PIP) install -r requirements.lock
	$(PIP) install --no-deps --no-build-isolation -e .
	touch $@

# npm writes node_modules/.package-lock.json on every install; reinstall only when the lock changes.
node_modules/.package-lock.json: package-lock.json
	npm ci --no-audit --no-fund
	touch $@

demo: setup
	$(VENV)/bin/vtrain demo

test: setup
	@$(PY) -m pytest -q $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: FAILED: pytest collected no tests (exit 5)" >&2; fi; \
	exit $$rc

clean:
	rm -rf build artifacts cache

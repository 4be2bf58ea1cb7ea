# make setup | make demo | make test   (needs python3.11, node 20, npm, and the package registries)
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
PYTEST_ARGS ?=

.PHONY: setup native demo test clean

setup: $(VENV)/.installed node_modules/.package-lock.json native

# The optional C SHA-256 tree builder (vtrain/commit/native.py). Without a working C compiler
# this warns and leaves commitments on the pure-Python path (same roots, slower); never fails.
NATIVE_LIB    := vtrain/commit/_sha256tree.so
NATIVE_CFLAGS ?= -O3 -fPIC -shared -pthread -fvisibility=hidden -Wall -Wextra

# The optional C numerics kernels (vtrain/numerics/native.py): every csrc/numerics/*.c in one
# library, with no FMA contraction (each kernel must give its numpy reference's bits). Same policy:
# without a compiler this warns and the numpy path is used (same bits, slower).
NUMERICS_LIB    := vtrain/numerics/_kernels.so
NUMERICS_SRC    := $(wildcard csrc/numerics/*.c)
NUMERICS_CFLAGS ?= -O3 -fPIC -shared -pthread -fvisibility=hidden -ffp-contract=off -fno-fast-math -Wall -Wextra

native: $(NATIVE_LIB) $(NUMERICS_LIB)

$(NUMERICS_LIB): $(NUMERICS_SRC) $(wildcard csrc/numerics/*.h)
	@if $(CC) $(NUMERICS_CFLAGS) -o $@.tmp $(NUMERICS_SRC) -lm 2>$@.log; then \
		mv $@.tmp $@; rm -f $@.log; echo "native: built $@ with $(CC)"; \
	else \
		rm -f $@.tmp; echo "native: WARNING: '$(CC)' could not build $@ (see $@.log);" \
			"the numerics use their numpy path (same bits, slower)" >&2; \
	fi

$(NATIVE_LIB): csrc/sha256tree.c
	@if $(CC) $(NATIVE_CFLAGS) -o $@.tmp $< 2>$@.log; then \
		mv $@.tmp $@; rm -f $@.log; echo "native: built $@ with $(CC)"; \
	else \
		rm -f $@.tmp; echo "native: WARNING: '$(CC)' could not build $@ (see $@.log);" \
			"commitments use the pure-Python SHA-256 trees (same roots, ~10x slower)" >&2; \
	fi

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
	rm -rf build artifacts cache $(NATIVE_LIB) $(NATIVE_LIB).log $(NUMERICS_LIB) $(NUMERICS_LIB).log

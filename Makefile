# Entry points. `make run` and `make test` do all set-up first (scripts/setup.sh, idempotent).
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup run test lint unit bench clean

setup:
	./scripts/setup.sh

run: setup
	$(BIN)/gpujitter top

test: setup lint
	$(BIN)/python -m pytest -ra

lint:
	$(BIN)/ruff check gpujitter probes daemon tui tests bench
	$(BIN)/ruff format --check gpujitter probes daemon tui tests bench
	./scripts/typecheck.sh

unit:
	$(BIN)/python -m pytest -ra tests/unit

bench: setup
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache

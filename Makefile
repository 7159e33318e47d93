# Entry points. `make run` and `make test` do all set-up first (scripts/setup.sh, idempotent).
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup run test test-matrix lint unit bench soak clean install install-files uninstall

setup:
	./scripts/setup.sh

run: setup
	$(BIN)/gpujitter top

test: setup lint
	$(BIN)/python -m pytest -ra --durations=15

lint:
	$(BIN)/ruff check gpujitter probes daemon tui tests bench
	$(BIN)/ruff format --check gpujitter probes daemon tui tests bench
	./scripts/typecheck.sh

unit:
	$(BIN)/python -m pytest -ra tests/unit

# Each sandbox option of the systemd unit on its own (minutes); `make test` runs them all
# together.
test-matrix: setup
	$(BIN)/python -m pytest -ra -m matrix

# The headline overhead figure: the default probe set with and without, on host workloads
# (root, no GPU, minutes). `$(BIN)/python -m bench` lists every benchmark and its command.
bench: setup
	flock /tmp/gpujitter-kernel.lock $(BIN)/python -m bench.default_set --rounds 5 --hook-floor

# The soak and fault suite (30 min, root): the daemon under slow and stuck clients, floods,
# a disk that fills, SIGHUP, SIGKILL and SIGTERM; fails on any lost record, leak, stall or
# slow exit. `make test` runs its short form (tests/kernel/test_soak.py) beside its tests that
# attach no probes (tests/kernel/soak_beside.py). No kernel lock: its probes watch only its
# own feeding loop, and other work on the node is welcome load.
soak: setup
	$(BIN)/python -m bench.soak --minutes 30 --json bench/results/dev-vm/soak.json

# The daemon as a systemd service (docs/operations.md). install-files does the copying
# alone; DESTDIR=dir stages it under another root.
install: setup install-files

install-files:
	DESTDIR=$(DESTDIR) ./scripts/install.sh

uninstall:
	DESTDIR=$(DESTDIR) ./scripts/install.sh --uninstall

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache

# The two commands of the README: `make setup` then `make test`.
PY ?= .venv/bin/python

.PHONY: setup test collect-env

setup:
	bash tools/setup.sh

test:
	@test -x $(PY) || { echo "no environment at $(PY): run 'make setup' first (or PY=python make test)"; exit 1; }
	$(PY) -m pytest tests

collect-env:
	$(PY) -m srvit_backbones.collect_env

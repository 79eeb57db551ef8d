"""``python -m srvit_backbones.benchmark ...`` is tools/benchmark.py (the peak-memory processes run this)."""
from .runner import main

main()

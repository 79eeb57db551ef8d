"""Training infrastructure of every entry point: mixed precision, fault handling, training curves."""

"""Training infrastructure shared by every entry point: mixed precision, faults (whole-or-nothing checkpoint writes,
divergence stops, collective timeouts) and training curves."""

"""Benchmarks of lookhere-dense (memory and time), as functions the tools call."""

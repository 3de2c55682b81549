"""Benchmarks; modules here can be run as scripts or imported by other benchmarks."""

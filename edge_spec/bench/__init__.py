"""Benchmarks: prompt sets, the runner and its reports."""

"""Benchmarks of the pipe and the tools: ``python -m benchmarks.run [--quick]``.

Every figure is measured next to its baseline in the same run (the ratio of
the two is what matters, because machines differ), against fake servers on
127.0.0.1 that run in a child process so they do not share the benchmark's
interpreter lock.
"""

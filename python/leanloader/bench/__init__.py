"""Side-by-side benchmarks of leanloader against other loaders.

`leanloader bench SCENARIO` and `leanloader demo` run them; see
``leanloader.bench.harness`` for the method and ``leanloader.bench.scenarios``
for how a scenario is declared.
"""

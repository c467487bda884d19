"""Fuzzing of every parser that reads what a user or a cluster sends: configs, state files,
traces, Prometheus text, Serve's JSON and the HTTP API's bodies and headers.

`targets.py` says, once, what each parser may raise and what its results must satisfy;
`mutations.py` is the seeded mutation engine; `seeds.py` the real inputs it starts from.
The tests here run them briefly under hypothesis; `benchmarks/fuzz.py` runs them for
millions of inputs.
"""

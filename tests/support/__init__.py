"""Support code shared by the tests and the benchmarks (not tests themselves): `server` starts the app.

Imported as `tests.support` from the repository root, where both `python -m pytest` and
`python -m bench.NAME` run, so neither needs a sys.path edit.
"""

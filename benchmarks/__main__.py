"""``python -m benchmarks [--quick] [--out docs/benchmarks/suite.md]``: the whole suite (:mod:`benchmarks.suite`)."""

from benchmarks.suite import main

if __name__ == "__main__":
    raise SystemExit(main())

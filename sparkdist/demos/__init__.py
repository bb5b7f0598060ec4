"""Training functions used by `sparkdist demo`, the benchmarks and the tests."""

"""Tests of the repository as a whole: runnable docs, the dependency lock, the wheel, the tools
script, the benchmarks' smoke run, the import graph and the layout."""

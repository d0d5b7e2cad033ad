"""GPU benchmarks of the KVBuffer kernels and the engine; results tables are generated into BENCHMARKS.md."""

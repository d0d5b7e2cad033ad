"""GPU benchmarks of the KVBuffer kernels and the engine; results tables are generated into BENCHMARKS.md.

Every `python -m benchmarks.X` first applies the kernel settings of the file that SPECDEC_KERNEL_SETTINGS names,
if set (a sweep's winners: benchmarks/kernel_settings.py)."""

from benchmarks.kernel_settings import apply_from_env

apply_from_env()

"""Stands for the GPU image's lack of pyspark: on PYTHONPATH first, `import pyspark` fails
as it does there (tests/test_gpu_check.py)."""

raise ModuleNotFoundError("No module named 'pyspark' (the GPU image has none)", name="pyspark")

"""Stands for the GPU image's lack of cryptography: on PYTHONPATH first, `import cryptography` fails
as it does there (tests/test_gpu_check.py)."""

raise ModuleNotFoundError(
    "No module named 'cryptography' (the GPU image has none)", name="cryptography"
)

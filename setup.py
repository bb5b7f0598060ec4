"""Packaging for sparkdist: distributed training on Apache Spark."""

from setuptools import find_packages, setup

EXTRAS = {
    "torch": ["torch>=2.1"],
    "tensorflow": ["tensorflow-cpu>=2.16"],
    "horovod": ["horovod==0.28.1"],
    # scikit-learn: the lowest of the runtime matrix, like install_requires (tests/test_floors.py).
    "ensemble": ["scikit-learn>=1.1.1", "xgboost-cpu>=2.0"],
    "mlflow": ["mlflow>=3,<4"],
    "mpi": ["mpi4py>=3.1"],
    # A Spark Connect client (pyspark's own dependency check names these floors).
    "connect": [
        "grpcio>=1.48.1",
        "grpcio-status>=1.48.1",
        "googleapis-common-protos>=1.56.4",
        "zstandard>=0.25.0",
    ],
    "tune": ["optuna>=4,<6"],
    "test": [
        "pytest>=8",
        "pytest-timeout>=2",
        "hypothesis>=6.100",
        "ruff>=0.6",
        "matplotlib>=3.8",
        "hyperopt>=0.2.7",
        # The torch frameworks that sparkdist runs unchanged
        # (tests/backends/test_torch_frameworks.py).
        "pytorch-lightning>=2.2",
        "accelerate>=0.30",
        "deepspeed>=0.14.1",
        # A notebook's kernel, for the test of what a notebook shows (tests/test_progress.py).
        "ipykernel>=6",
        "jupyter_client>=8",
    ],
}
EXTRAS["all"] = sorted({req for name, reqs in EXTRAS.items() if name != "horovod" for req in reqs})

setup(
    name="sparkdist",
    version="0.1.0",
    description="Distributed training on Apache Spark: a HorovodRunner for today's frameworks, "
    "and partition ensembles.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["sparkdist", "sparkdist.*"]),
    package_data={"sparkdist": ["py.typed", "log4j2.properties"]},
    # Floors are the lowest versions of the runtime matrix (requirements/runtimes/*.txt), so that
    # installing sparkdist on a supported runtime upgrades nothing it ships under Spark;
    # tests/test_floors.py keeps them equal. pyspark 4 checks its own, higher ones.
    install_requires=[
        "pyspark>=3.5.0",
        "cloudpickle>=2.0.0",
        "numpy>=1.23.5",
        "pandas>=1.5.3",
        "pyarrow>=8.0.0",
        "psutil>=5.9.0",
        # The per-job TLS key and certificate of every channel (protocol/job_secret).
        "cryptography>=39.0.1",
        # pyspark 3.5 imports distutils (pyspark/sql/pandas/utils.py), which Python 3.12 only
        # has through setuptools; a fresh 3.12 venv has none.
        'setuptools>=74.0.0; python_version >= "3.12"',
    ],
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["sparkdist=sparkdist.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)

"""The version of ``specdec-trees``, written in this one place.

``pyproject.toml`` reads it when the distribution is built (``[tool.setuptools.dynamic]``),
``specdec.__version__`` re-exports it and ``specdec --version`` prints it.
"""

__version__ = "0.1.0"

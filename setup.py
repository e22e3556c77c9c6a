"""Builds wire's optional C fast paths (wire/_speedups.c and _speedups_ids.c); everything else
is in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and wire runs its pure-Python
code, which gives the same results (slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "wire._speedups",
            ["wire/_speedups.c", "wire/_speedups_ids.c"],
            optional=True,
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    ]
)

# The C library is compiled by cffi at install time (API mode); everything else is in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["cext/build.py:ffibuilder"])

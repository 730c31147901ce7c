"""Only here for the cffi extension (``cffi_modules`` has no pyproject.toml spelling)."""

from setuptools import setup

setup(cffi_modules=["transport/_ucp_build.py:ffibuilder"])

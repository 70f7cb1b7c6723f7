# The cffi build of native/ hooks in here: cffi's setuptools integration is the
# ``cffi_modules`` keyword, which pyproject.toml cannot express.  Everything else is there.
from setuptools import setup

setup(cffi_modules=["native/build_native.py:ffibuilder"])

"""Build glue: package discovery under the fixed layout and the native (cffi) extension."""
from setuptools import setup


def _packages() -> list[str]:
    import os

    pkgs = []
    for root_dir, name in (("daemon", "inferd"), ("client", "inferd_client")):
        for dirpath, _dirs, files in os.walk(root_dir):
            if "__init__.py" in files and "__pycache__" not in dirpath:
                rel = os.path.relpath(dirpath, root_dir)
                pkgs.append(name if rel == "." else name + "." + rel.replace(os.sep, "."))
    return sorted(pkgs)


setup(
    packages=_packages(),
    cffi_modules=["native/build_native.py:ffibuilder"],
)

"""Build glue: package discovery under the fixed layout and the native (cffi) extension."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithShaders(build_py):
    """Ship the top-level shaders/ inside the package (inferd/_shaders) for non-editable installs."""

    def run(self) -> None:
        super().run()
        dst = Path(self.build_lib) / "inferd" / "_shaders"
        dst.mkdir(parents=True, exist_ok=True)
        for f in Path("shaders").iterdir():
            if f.suffix in (".comp", ".glsl"):
                shutil.copy2(f, dst / f.name)


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
    cmdclass={"build_py": BuildWithShaders},
)

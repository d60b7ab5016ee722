"""Build glue: package discovery under the fixed layout and the native (cffi) extension."""
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithShaders(build_py):
    """Ship the top-level shaders/ inside the package (inferd/_shaders) for non-editable installs, and the SPIR-V
    of the variants shaders/shipped.txt lists (inferd/_spirv, inferd.vulkan.precompile), so that a first start
    runs no GLSL compiler. A build that cannot precompile (no glslangValidator, no numpy in an isolated build
    environment) ships the sources alone: the variants then compile at first use, as in an editable install."""

    def run(self) -> None:
        super().run()
        pkg = Path(self.build_lib) / "inferd"
        dst = pkg / "_shaders"
        dst.mkdir(parents=True, exist_ok=True)
        for f in Path("shaders").iterdir():
            if f.suffix in (".comp", ".glsl") or f.name == "shipped.txt":
                shutil.copy2(f, dst / f.name)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(self.build_lib).resolve()),
                                                                        os.environ.get("PYTHONPATH")])),
                   INFERD_SHADER_DIR=str(dst.resolve()))
        r = subprocess.run([sys.executable, "-m", "inferd.vulkan.precompile", "--out", str((pkg / "_spirv").resolve())],
                           env=env, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"warning: no SPIR-V shipped (variants compile at first use): {(r.stderr or r.stdout).strip()[-300:]}")


def _compile_in_parallel() -> None:
    """Compile the extension's C sources on every core. distutils compiles one extension's sources one after
    another: the native build took 2.7 min on a 2-core VM, most of a fresh install, and a Jetson has 6 to 12
    cores. Same steps as ``CCompiler.compile``, in the order of ``sources`` (native/build_native.py lists the
    longest compiles first)."""
    try:
        from setuptools._distutils import ccompiler
    except ImportError:  # another distutils layout: the serial build still works
        return

    def compile(self, sources, output_dir=None, macros=None, include_dirs=None, debug=0,  # noqa: A001
                extra_preargs=None, extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)
        todo = [obj for obj in objects if obj in build]
        jobs = int(os.environ.get("INFERD_BUILD_JOBS", 0)) or os.cpu_count() or 1
        with ThreadPoolExecutor(max_workers=jobs) as pool:  # each compile is a child process: threads suffice
            list(pool.map(lambda obj: self._compile(obj, *build[obj], cc_args, extra_postargs, pp_opts), todo))
        return objects

    ccompiler.CCompiler.compile = compile


_compile_in_parallel()


def _packages() -> list[str]:
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

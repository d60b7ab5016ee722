"""SPIR-V shipped with the package (inferd.vulkan.precompile): the variant list, the build step's output read by a
cache that never compiled them, and the list covering what the zoo's models ask for on this device."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import inferd.vulkan
from inferd.vulkan.precompile import default_list, main, precompile, read_list, write_list
from inferd.vulkan.shaders import ShaderCache, compiler, norm_defines, shader_dir

needs_glslang = pytest.mark.skipif(compiler() is None, reason="no glslangValidator")


pytestmark = pytest.mark.usefixtures("no_test_spirv")  # these count what compiles and what is read


def test_the_list_round_trips_and_a_bad_line_is_named(tmp_path: Path) -> None:
    v = [("unary", norm_defines({"UOP": 3, "ACT": 0})), ("copy", ())]
    p = tmp_path / "list.txt"
    write_list(p, v)
    assert sorted(read_list(p)) == sorted(v)
    p.write_text("unary ACT=0  # a comment\n\n# only a comment\nbinary BOP\n")
    with pytest.raises(ValueError, match=r"list.txt:4: 'BOP' is not KEY=VALUE"):
        read_list(p)


def test_the_shipped_list_parses_and_names_existing_shaders() -> None:
    variants = read_list(default_list())
    assert len(variants) > 100
    names = {p.stem for p in shader_dir().glob("*.comp")}
    assert {n for n, _ in variants} <= names


@needs_glslang
def test_precompiled_variants_serve_a_cache_that_never_compiled_them(tmp_path: Path, monkeypatch: Any) -> None:
    """What the build writes into the package's _spirv is read (here through $INFERD_SPIRV_PATH) before
    compiling; a damaged entry is a miss that compiles, never a wrong module."""
    v = [("unary", norm_defines({"UOP": 1, "ACT": 0})), ("copy", ())]
    assert precompile(v, tmp_path / "ship") == 2
    monkeypatch.setenv("INFERD_SPIRV_PATH", str(tmp_path / "ship"))
    # a build beside another precompiled set still writes every variant into its own
    assert precompile(v, tmp_path / "ship2") == 2
    assert len(list((tmp_path / "ship2" / "spirv").glob("*.spv"))) == 2
    cache = ShaderCache(tmp_path / "cache")
    mods = cache.get_many(v)
    assert cache.compiled == 0 and cache.disk_hits == 2
    fresh = ShaderCache(None)
    fresh.prebuilt = []
    ref = fresh.get_many(v)
    assert fresh.compiled == 2
    for a, b in zip(mods, ref):
        assert a.spirv == b.spirv and a.manifest.bindings == b.manifest.bindings
    # damage one shipped entry: that variant compiles, the other is still read
    spv = next(p for p in (tmp_path / "ship" / "spirv").glob("*.spv") if p.stem == mods[0].key)
    spv.write_bytes(b"\x00" * 64)
    cache2 = ShaderCache(tmp_path / "cache2")
    got = cache2.get_many(v)
    assert cache2.compiled == 1 and cache2.disk_hits == 1 and got[0].spirv == ref[0].spirv


@needs_glslang
def test_the_command_compiles_a_list_into_a_directory(tmp_path: Path) -> None:
    lst = tmp_path / "l.txt"
    write_list(lst, [("copy", ())])
    assert main(["--list", str(lst), "--out", str(tmp_path / "o")]) == 0
    assert len(list((tmp_path / "o" / "spirv").glob("*.spv"))) == 1


@pytest.mark.vulkan
@pytest.mark.skipif(not inferd.vulkan.available(), reason="no Vulkan device")
def test_the_shipped_list_holds_every_variant_squeezenet_can_ask_for_here() -> None:
    """scripts/spirv_record.py keeps the list current: a kernel whose defines change fails here until it is run."""
    from inferd.frontend import import_model
    from inferd.vulkan.precompile import model_variants
    from zoo_fixture import zoo_path

    listed = set(read_list(default_list()))
    g = import_model(zoo_path("squeezenet1_1"))
    for precision in ("fp32", "fp16"):
        missing = model_variants(g, precision) - listed
        assert not missing, f"{precision}: {sorted(missing)[:5]} not in {default_list()}: run scripts/spirv_record.py"

"""The llama.cpp build itself: what its native libraries export."""

from __future__ import annotations

import platform

import pytest

from edge_spec.backend.runtime import exported_std_symbols, llama_library_paths


@pytest.mark.skipif(platform.system() != "Linux", reason="the version script is a Linux build's")
def test_the_built_libraries_export_no_cpp_standard_library_symbols() -> None:
    """Every library llama-cpp-python loads keeps its copies of std templates local, so none
    can bind to another extension's (the CUDA build crashed in std::regex that way)."""
    paths = [p for p in llama_library_paths() if not p.is_symlink()]
    assert paths
    counts = {p.name: exported_std_symbols(p) for p in paths}
    if None in counts.values():
        pytest.skip(f"binutils' nm cannot read them: {counts}")
    assert set(counts.values()) == {0}, counts

"""Device profiles: cost curves, JSON round trips, cache keys and reuse, the profile command.

The pure tests never measure: `device.measure_profile` is replaced by a fake that builds a
handmade profile, and cache reuse is proven by making that fake fail when called again (never by
timing). The one `models` test profiles the real SmolLM2 pair in quick mode into a temporary
cache and checks the shape and sanity of what it measured, not its speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from edge_spec import backend, files
from edge_spec.cli import profile as profile_command
from edge_spec.device import numerics, probes
from edge_spec.device import profile as device
from edge_spec.device.profile import DeviceProfile, HostInfo, ModelCost
from edge_spec.errors import EdgeSpecError, ModelFileError
from edge_spec.files import HashCache


def _host(**changes: object) -> HostInfo:
    host = HostInfo(
        hostname="box",
        system="Linux",
        machine="x86_64",
        cpu_model="Test CPU",
        n_cpu_logical=2,
        n_cpu_physical=2,
        n_threads=2,
        ram_total_bytes=24 << 30,
        ram_available_bytes=20 << 30,
        gpu_offload=False,
        n_gpu_layers=0,
        vram_total_bytes=None,
        vram_free_bytes=None,
        unified_memory=False,
        bandwidth_gbps=17.0,
        copy_gbps=25.0,
        llama_cpp_version="0.3.36",
        llama_build="CPU : AVX512 = 1 | LLAMAFILE = 1",
    )
    return dataclasses.replace(host, **changes)


def _cost(name: str, t1_s: float, slope_s: float) -> ModelCost:
    return ModelCost(
        file_name=name,
        sha256="ab" * 32,
        file_size_bytes=1000,
        description="test 1M F16",
        n_ctx_probe=256,
        verify_s=tuple(t1_s + slope_s * (n - 1) for n in range(1, 17)),
        measured_ns=(1, 2, 4, 8, 16),
        n_repeats=5,
    )


def _profile(quick: bool = True, key: str = "k", draft: bool = True) -> DeviceProfile:
    return DeviceProfile(
        host=_host(),
        target=_cost("target.gguf", 0.020, 0.002),
        draft=_cost("draft.gguf", 0.010, 0.001) if draft else None,
        ngram_s=5e-5,
        other_cores_busy=0.0,
        quick=quick,
        created="2026-12-02T00:00:00+00:00",
        profile_s=1.0,
        key=key,
    )


def _gguf(path: Path, payload: bytes = b"weights") -> Path:
    """A file that passes gguf.check_gguf_file (magic, version 3); never loaded."""
    path.write_bytes(b"GGUF" + struct.pack("<I", 3) + bytes(16) + payload)
    return path


class FakeMeasure:
    """Stands in for device.measure_profile; fails when called more than `allowed` times."""

    def __init__(self, allowed: int = 1) -> None:
        self.allowed = allowed
        self.calls: list[bool] = []  # the quick flag of each call

    def __call__(self, request: object, quick: bool) -> DeviceProfile:
        self.calls.append(quick)
        if len(self.calls) > self.allowed:
            raise AssertionError("measured again although a usable profile was cached")
        return dataclasses.replace(_profile(quick=quick), key=request.key)


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    models = tmp_path / "models"
    models.mkdir()
    return _gguf(models / "target.gguf", b"target"), _gguf(models / "draft.gguf", b"draft")


# ---- the profile as data ---------------------------------------------------------------------


def test_cost_curve_from_a_handmade_profile() -> None:
    profile = _profile()
    curve = profile.cost_curve()
    assert curve.verify_s == profile.target.verify_s and len(curve.verify_s) == 16
    assert curve.draft_token_s == profile.draft.t(1) == 0.010
    assert curve.draft_verify_s == profile.draft.verify_s
    assert curve.ngram_s == 5e-5
    assert curve.c == pytest.approx(0.5)
    assert curve.t(4) == pytest.approx(0.026)
    alone = _profile(draft=False).cost_curve()
    assert alone.draft_token_s == 0.0 and alone.draft_verify_s == ()


def test_json_round_trip(tmp_path: Path) -> None:
    for profile in (_profile(), _profile(draft=False, quick=False)):
        assert DeviceProfile.from_json(profile.to_json()) == profile
        path = tmp_path / "p.json"
        device.save_profile(profile, path)
        assert device.load_profile(path) == profile
    loaded = DeviceProfile.from_json(_profile().to_json())
    assert isinstance(loaded.target.verify_s, tuple) and isinstance(loaded.host, HostInfo)


def test_a_profile_saved_before_the_build_was_recorded_still_loads() -> None:
    data = json.loads(_profile().to_json())
    del data["host"]["llama_build"]
    assert DeviceProfile.from_json(json.dumps(data)).host.llama_build == ""


def test_build_features_keep_what_is_on() -> None:
    cpu = "CPU : SSE3 = 1 | AVX = 0 | AVX512 = 1 | LLAMAFILE = 1 | OPENMP = 1"
    assert profile_command.build_features(cpu) == "CPU: SSE3 AVX512 LLAMAFILE OPENMP"
    cuda = "CUDA : ARCHS = 890 | USE_GRAPHS = 1 | " + cpu
    assert profile_command.build_features(
        cuda
    ) == "CUDA: ARCHS=890 USE_GRAPHS " + profile_command.build_features(cpu)
    assert profile_command.build_features("") == ""


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.update(schema=99),
        lambda d: d["target"].update(verify_s=[0.01] * 3),
        lambda d: d["target"].update(verify_s=[0.0] * 16),
        lambda d: d["host"].pop("hostname"),
        lambda d: d.update(surprise=1),
    ],
)
def test_malformed_or_other_schema_profiles_are_rejected(edit) -> None:
    data = json.loads(_profile().to_json())
    edit(data)
    with pytest.raises(EdgeSpecError, match="invalid device profile"):
        DeviceProfile.from_json(json.dumps(data))


def test_unreadable_profiles_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(EdgeSpecError):
        DeviceProfile.from_json("[1, 2]")
    with pytest.raises(EdgeSpecError):
        DeviceProfile.from_json("{ not json")
    with pytest.raises(EdgeSpecError):
        device.load_profile(tmp_path / "missing.json")


# ---- keys ------------------------------------------------------------------------------------


def test_key_changes_with_everything_that_changes_the_numbers() -> None:
    base = dict(
        hostname="box",
        cpu_model="Test CPU",
        target_sha256="a" * 64,
        draft_sha256="b" * 64,
        n_threads=2,
        gpu_offload=False,
        n_gpu_layers=0,
        llama_cpp_version="0.3.36",
        llama_build="CPU : AVX512 = 1 | LLAMAFILE = 1",
        llama_libraries="d" * 64,
    )
    key = device.profile_key(**base)
    assert key == device.profile_key(**base) and len(key) == 24
    changes = dict(
        hostname="other",
        cpu_model="Other CPU",
        target_sha256="c" * 64,
        draft_sha256=None,
        n_threads=1,
        gpu_offload=True,
        n_gpu_layers=10,
        llama_cpp_version="0.3.37",
        llama_build="CPU : AVX512 = 1 | LLAMAFILE = 0",  # same version, rebuilt with other flags
        llama_libraries="e" * 64,  # same flags, other code (a patch to llama.cpp)
        cuda_batch_invariant=0,  # a patched CUDA build with GGML_CUDA_BATCH_INVARIANT=0
    )
    keys = {device.profile_key(**{**base, name: value}) for name, value in changes.items()}
    assert key not in keys and len(keys) == len(changes)
    on = {device.profile_key(**base, cuda_batch_invariant=mode) for mode in (1, 2)}
    assert len(on) == 2 and not on & (keys | {key})  # 0, 1, 2 and not there: four keys
    assert backend.cuda_batch_invariant() is None  # this CPU build has no CUDA library


def test_the_libraries_digest_follows_the_native_code(cache: Path, tmp_path: Path) -> None:
    installed = backend.llama_library_paths()
    assert installed and all(path.is_file() for path in installed)
    assert any(path.name.startswith("libggml-cpu") for path in installed)  # the CPU kernels
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libggml-cpu.so").write_bytes(b"kernel A")
    (lib / "libllama.so").write_bytes(b"llama")
    paths = sorted(lib.iterdir())
    first = device.libraries_sha256(paths)
    assert len(first) == 64 and first == device.libraries_sha256(paths)
    assert first != device.libraries_sha256(installed)
    (lib / "libggml-cpu.so").write_bytes(b"kernel B, patched")  # same names, other code
    assert device.libraries_sha256(paths) != first


def test_profile_path_follows_threads_files_and_offload(
    cache: Path, pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    target, draft = pair
    path = device.profile_path(target, draft, n_threads=2)
    assert path.parent == cache / "profiles" and path.suffix == ".json"
    assert path == device.profile_path(target, draft, n_threads=2)
    assert path != device.profile_path(target, draft, n_threads=1)
    assert path != device.profile_path(target, None, n_threads=2)
    assert path != device.profile_path(draft, target, n_threads=2)
    # No offload in this build: the layer count cannot change the numbers, so not the key.
    monkeypatch.setattr(backend, "supports_gpu_offload", lambda: False)
    assert device.profile_path(target, draft, n_threads=2, n_gpu_layers=5) == path
    monkeypatch.setattr(backend, "supports_gpu_offload", lambda: True)
    gpu_all = device.profile_path(target, draft, n_threads=2, n_gpu_layers=-1)
    gpu_5 = device.profile_path(target, draft, n_threads=2, n_gpu_layers=5)
    assert len({path, gpu_all, gpu_5}) == 3
    monkeypatch.setattr(backend, "supports_gpu_offload", lambda: False)
    # llama-cpp-python rebuilt with other flags at the same version: measured again.
    built = backend.llama_build()
    assert "CPU" in built  # what this build really reports
    monkeypatch.setattr(backend, "llama_build", lambda: built + " | GGML_LLAMAFILE = 0")
    assert device.profile_path(target, draft, n_threads=2) != path
    monkeypatch.setattr(backend, "llama_build", lambda: built)
    assert device.profile_path(target, draft, n_threads=2) == path
    _gguf(target, b"other weights")  # new content (and size): new sha256, new key
    assert device.profile_path(target, draft, n_threads=2) != path


def test_a_file_is_hashed_once_per_size_and_mtime(
    cache: Path, pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    target, _ = pair
    hashed: list[Path] = []
    real_hash = files.hash_file
    monkeypatch.setattr(files, "hash_file", lambda p: hashed.append(p) or real_hash(p))
    sha = files.file_sha256(target)
    assert files.file_sha256(target) == sha and hashed == [target]
    assert HashCache(cache / "profiles").get(target) is not None
    os.utime(target, ns=(2, 2))  # touched: hash again
    assert files.file_sha256(target) == sha and len(hashed) == 2


def test_a_prepared_models_sidecar_is_used_without_hashing(
    cache: Path, pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    target, _ = pair
    HashCache(target.parent).put(target, "f" * 64, "built")  # what models.prepare leaves
    monkeypatch.setattr(files, "hash_file", lambda p: pytest.fail("hashed a known file"))
    assert files.file_sha256(target) == "f" * 64


def test_not_a_gguf_is_a_model_file_error(cache: Path, tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_text("not a model")
    with pytest.raises(ModelFileError):
        device.load_or_profile(tmp_path / "x.gguf")
    with pytest.raises(ModelFileError):
        device.load_or_profile(tmp_path / "missing.gguf")


# ---- the cache -------------------------------------------------------------------------------


def test_a_cached_profile_is_reused(
    cache: Path, pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    measure = FakeMeasure(allowed=1)
    monkeypatch.setattr(device, "measure_profile", measure)
    caplog.set_level(logging.INFO, logger="edge_spec.device")
    first, path, cached = device.lookup_or_profile(*pair, n_threads=2)
    assert not cached and path.is_file() and path.parent == cache / "profiles"
    assert first.key == path.stem
    again = device.load_or_profile(*pair, n_threads=2)  # the fake would fail if it measured
    assert again == first and measure.calls == [True]
    assert "reusing" in caplog.text
    # Another thread count is another profile.
    with pytest.raises(AssertionError, match="measured again"):
        device.load_or_profile(*pair, n_threads=1)


def test_quick_does_not_satisfy_full_but_full_satisfies_quick(
    cache: Path, pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    measure = FakeMeasure(allowed=2)
    monkeypatch.setattr(device, "measure_profile", measure)
    assert device.load_or_profile(*pair, n_threads=2, quick=True).quick
    full = device.load_or_profile(*pair, n_threads=2, quick=False)
    assert not full.quick and measure.calls == [True, False]
    assert device.load_or_profile(*pair, n_threads=2, quick=True) == full
    assert device.load_or_profile(*pair, n_threads=2, quick=False) == full
    assert measure.calls == [True, False]


def test_refresh_measures_again(
    cache: Path, pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    measure = FakeMeasure(allowed=2)
    monkeypatch.setattr(device, "measure_profile", measure)
    device.load_or_profile(*pair)
    device.load_or_profile(*pair, refresh=True)
    assert measure.calls == [True, True]


def test_a_corrupt_or_foreign_cache_file_is_measured_again(
    cache: Path, pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    measure = FakeMeasure(allowed=3)
    monkeypatch.setattr(device, "measure_profile", measure)
    path = device.profile_path(*pair)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{ not json")
    assert device.load_or_profile(*pair).key == path.stem
    device.save_profile(_profile(key="someone else's"), path)
    assert device.load_or_profile(*pair).key == path.stem
    assert len(measure.calls) == 2
    assert not list(path.parent.glob("*.tmp"))  # atomic writes leave no temp files


# ---- the command -----------------------------------------------------------------------------


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    profile_command.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["profile", *argv])


def test_profile_command_json_then_cached_table(
    cache: Path, pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setattr(device, "measure_profile", FakeMeasure(allowed=1))
    target, draft = (str(p) for p in pair)
    assert profile_command.run(_parse("-m", target, "-md", draft, "-t", "2", "--json")) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cached"] is False and Path(out["path"]).is_file()
    assert len(out["cost_curve"]["verify_s"]) == 16 and out["profile"]["quick"] is True
    assert profile_command.run(_parse("-m", target, "-md", draft, "-t", "2")) == 0
    table = capsys.readouterr().out
    assert "from the cache" in table and "c = draft t(1) / target t(1) = 0.50" in table
    assert out["path"] in table and "target.gguf" in table and "draft.gguf" in table


def test_profile_command_options(cache: Path) -> None:
    args = _parse()
    assert not (args.full or args.refresh or args.json or args.no_draft)
    assert args.threads is None and args.n_gpu_layers == -1
    assert _parse("--full").full and not _parse("--quick").full
    with pytest.raises(SystemExit):
        _parse("--quick", "--full")
    with pytest.raises(EdgeSpecError):
        profile_command.run(_parse("--no-draft", "--draft", "x.gguf"))
    with pytest.raises(EdgeSpecError):
        profile_command.run(_parse("--threads", "0"))


def test_table_without_draft_marks_interpolated_rows() -> None:
    table = profile_command.format_profile(_profile(draft=False), Path("/p.json"), cached=False)
    rows = [line for line in table.splitlines() if line[:2].strip().isdigit()]
    assert len(rows) == 16 and "~" in rows[2] and "~" not in rows[3]  # n=3 interpolated, n=4 not
    assert "c = " not in table and "measured now" in table


# ---- probes (no model) -----------------------------------------------------------------------


class ScriptedModel:
    """Just enough of backend.LlamaModel for probes.time_batches; records every decode."""

    def __init__(self, name: str, log: list[tuple[str, int, tuple[int, ...]]]) -> None:
        self.path = Path(name)
        self.n_batch, self.n_ctx = 64, 300
        self.tokens: list[int] = []
        self.log = log

    def tokenize(self, text: str) -> list[int]:
        return [1] + [len(word) for word in text.split()]

    def reset(self) -> None:
        self.tokens = []

    def decode(self, tokens: list[int], logit_rows: range | tuple[int, ...] = ()) -> None:
        self.log.append((self.path.name, len(tokens), tuple(logit_rows)))
        self.tokens += tokens

    def truncate(self, n_keep: int) -> None:
        del self.tokens[n_keep:]


def test_time_batches_interleaves_models_and_sizes_and_rolls_back() -> None:
    calls: list[tuple[str, int, tuple[int, ...]]] = []
    models = [ScriptedModel("t", calls), ScriptedModel("d", calls)]
    times = probes.time_batches(models, 200, (1, 2, 4), repeats=3)
    assert [sorted(t) for t in times] == [[1, 2, 4], [1, 2, 4]]
    assert all(len(ts) == 3 and min(ts) >= 0 for t in times for ts in t.values())
    assert calls[:2] == [("t", 200, ()), ("d", 200, ())]  # the contexts, no logits
    batches = calls[2:]
    assert all(rows == tuple(range(n)) for _, n, rows in batches)  # logits on every row
    assert [(m, n) for m, n, _ in batches[:6]] == [(m, n) for n in (1, 2, 4) for m in "td"]
    timed = [n for m, n, _ in batches[6:] if m == "t"]  # after the warm-up
    assert timed == [1, 2, 4, 4, 2, 1, 1, 2, 4]  # ascending, descending, ascending
    assert all(len(model.tokens) == 200 for model in models)


def test_time_batches_stops_at_min_repeats_once_over_budget() -> None:
    calls: list[tuple[str, int, tuple[int, ...]]] = []
    model = ScriptedModel("t", calls)
    times = probes.time_batches([model], 10, (1, 16), 9, min_repeats=2, budget_s=0.0)
    assert [len(ts) for ts in times[0].values()] == [2, 2]
    with pytest.raises(ValueError, match="n_batch"):
        probes.time_batches([model], 10, (1, 65), 1)
    with pytest.raises(ValueError, match="n_ctx"):
        probes.time_batches([model], 290, (1, 16), 1)


def test_curve_interpolates_between_measured_points() -> None:
    curve = probes.curve_from_medians({1: 1.0, 4: 4.0, 16: 10.0}, 16)
    assert len(curve) == 16 and curve[1] == pytest.approx(2.0) and curve[9] == pytest.approx(7.0)
    with pytest.raises(ValueError):
        probes.curve_from_medians({2: 1.0, 16: 2.0}, 16)


def test_host_probes_report_something_sane() -> None:
    logical, physical = probes.cpu_counts()
    assert logical >= physical >= 1
    total, available = probes.ram_bytes()
    assert total >= available > 0
    assert probes.cpu_model() and probes.hostname()
    assert probes.probe_array_bytes(256, 1 << 30) == 128 << 20  # at most 1/8 of free RAM
    assert probes.probe_array_bytes(256, 64 << 30) == 256 << 20
    read_gbps, copy_gbps = probes.bandwidth_gbps(1 << 20, 1)
    assert read_gbps > 0 and copy_gbps > 0
    assert probes.ngram_lookup_s(n_context=64, repeats=3) > 0
    assert probes.OtherLoad().cores() >= 0.0


def test_a_profile_measured_on_a_busy_machine_says_so() -> None:
    busy = dataclasses.replace(_profile(), other_cores_busy=1.5)
    assert "costs may be inflated" in profile_command.format_profile(
        busy, Path("/p.json"), cached=True
    )
    assert "inflated" not in profile_command.format_profile(
        _profile(), Path("/p.json"), cached=True
    )


# ---- the real models -------------------------------------------------------------------------


@pytest.mark.models
def test_quick_profile_of_the_smollm2_pair(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from edge_spec.models.cache import resolve

    target = resolve("smollm2-135m-f16", progress=False)  # the real model cache
    draft = resolve("smollm2-135m-q4_0", progress=False)
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path / "cache"))
    profile, path, cached = device.lookup_or_profile(target, draft, quick=True)
    assert not cached and path.parent == tmp_path / "cache" / "profiles"
    assert profile.quick and profile.draft is not None
    for cost in (profile.target, profile.draft):
        assert len(cost.verify_s) == 16 and all(t > 0 for t in cost.verify_s)
        assert cost.t(16) > cost.t(1)
        assert set(cost.measured_ns) == set(device.QUICK.ns) and cost.n_ctx_probe == 256
    assert profile.draft.t(1) < profile.target.t(1)  # Q4_0 draft vs F16 target
    assert profile.host.bandwidth_gbps > 0 and profile.host.copy_gbps > 0
    assert profile.host.n_threads >= 1 and profile.host.ram_total_bytes > 0
    curve = profile.cost_curve()
    assert 0 < curve.c < 1 and curve.ngram_s > 0
    assert device.load_or_profile(target, draft) == profile  # now from the cache


# ---- batch deviation -------------------------------------------------------------------------


def test_deviation_measures_what_can_flip_a_choice() -> None:
    from edge_spec.device.numerics import deviation

    alone = np.array([[1.0, 0.9, -2.0], [0.0, 3.0, 1.0]], dtype=np.float32)
    batched = alone.copy()
    batched[0] += 0.5  # every logit of a row moved alike: no choice can flip
    assert deviation(alone, batched, 2) == numerics.BatchDeviation(2, 2, 0.5, 0.0, 0)
    batched[0, 1] += 0.2  # the runner-up gains 0.2 on the leader: the leader's 0.1 is gone
    moved = deviation(alone, batched, 2)
    assert moved.max_gap_change == pytest.approx(0.2) and moved.argmax_moved == 1
    assert moved.max_logit_change == pytest.approx(0.7)


def test_profile_deviation_command(
    pair: tuple[Path, Path], cache: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """`edge-spec profile --deviation` adds the target's batch deviation to the profile: the
    table and the JSON say the same; with --rpc it refuses before loading anything."""
    monkeypatch.setattr(device, "measure_profile", FakeMeasure(allowed=1))
    measured = numerics.Numerics(
        "target.gguf",
        -1,
        True,
        True,
        (
            numerics.BatchDeviation(2, 47, 0.0, 0.0, 0),
            numerics.BatchDeviation(16, 47, 0.5, 0.75, 2),
        ),
    )
    seen = []
    monkeypatch.setattr(
        profile_command, "batch_deviation", lambda target, args: seen.append(target) or measured
    )
    argv = ("-m", str(pair[0]), "--no-draft", "--deviation")
    assert profile_command.run(_parse(*argv, "--json")) == 0
    assert json.loads(capsys.readouterr().out)["deviation"] == measured.to_dict()
    assert profile_command.run(_parse(*argv)) == 0
    table = capsys.readouterr().out
    assert "batched logits against one-token logits: target.gguf, GPU offload every layer" in table
    assert "16    47            0.5         0.75             2" in table
    assert "CUDA batch invariance" not in table  # None: no CUDA library, or one without the patch
    assert "Batches of 16 move logits" in table
    across = dataclasses.replace(measured, boundary=numerics.BatchDeviation(8, 8, 0.1, 0.9, 1))
    assert across.worst_gap_change == 0.9  # the batch across the KV view's step counts too
    table = numerics.format_numerics(across)
    row = " 8     8            0.1          0.9             1  across the KV view's 256-cell step"
    assert row in table
    assert "Batches of 16, 8 across 256 cells move logits" in table
    assert seen == [pair[0], pair[0]]
    on_cuda = dataclasses.replace(measured, cuda_batch_invariant=0)
    assert "CUDA batch invariance (scripts/patches/cuda/): off" in numerics.format_numerics(on_cuda)
    mmq = numerics.format_numerics(dataclasses.replace(measured, cuda_batch_invariant=2))
    assert "CUDA batch invariance (scripts/patches/cuda/): on, quantized weights through" in mmq
    with pytest.raises(EdgeSpecError, match="drop --rpc"):
        profile_command.run(_parse(*argv, "--rpc", "127.0.0.1:1"))

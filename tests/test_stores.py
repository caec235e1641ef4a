"""The models people already have: real layouts of Ollama's, LM Studio's and the Hugging Face
hub cache's stores, built around the registry GGUFs in a temporary home, listed by
`models scan`, loaded by their store names, and a draft chosen for a target given alone."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import link_or_copy

from edge_spec.errors import InvalidRequestError, ModelFileError
from edge_spec.files import hash_file
from edge_spec.models import stores
from edge_spec.models.cache import pick_pair, resolve

pytestmark = [pytest.mark.models, pytest.mark.xdist_group("stores")]

OLLAMA_NAME = "ollama:smollm2:135m"
LMSTUDIO_REPO = "lmstudio-community/SmolLM2-135M-Instruct-GGUF"
LMSTUDIO_NAME = f"lmstudio:{LMSTUDIO_REPO}/SmolLM2-135M-Instruct-Q4_0.gguf"
HF_REPO = "ggml-org/gemma-3-270m-GGUF"
HF_NAME = f"hf:{HF_REPO}/gemma-3-270m-Q4_0.gguf"
STORE_ENV = (
    "OLLAMA_MODELS",
    "HF_HOME",
    "HF_HUB_CACHE",
    "XDG_CACHE_HOME",
    "LLAMA_CACHE",
    "EDGE_SPEC_MODEL_PATH",
)


def _ollama(root: Path, name: str, tag: str, model: Path, blob: Path | None = None) -> Path:
    """An Ollama manifest naming `model`'s bytes by sha256 (or `blob`'s, a broken one),
    beside a template layer, as `ollama pull` leaves them."""
    source = blob or model
    digest = hash_file(source)
    link_or_copy(source, root / "blobs" / f"sha256-{digest}")
    template = b"{{ .Prompt }}"
    template_digest = hashlib.sha256(template).hexdigest()
    (root / "blobs" / f"sha256-{template_digest}").write_bytes(template)
    namespace, _, base = name.rpartition("/")
    manifest = root / "manifests" / "registry.ollama.ai" / (namespace or "library") / base / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    layers = [
        {
            "mediaType": "application/vnd.ollama.image.model",
            "digest": f"sha256:{digest}",
            "size": source.stat().st_size,
        },
        {
            "mediaType": "application/vnd.ollama.image.template",
            "digest": f"sha256:{template_digest}",
            "size": len(template),
        },
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return root / "blobs" / f"sha256-{digest}"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> dict[str, Path]:
    """A fresh home holding: SmolLM2-135M F16 in Ollama (and a half-downloaded model beside
    it), its Q4_0 in LM Studio (with a projector file that is not a model), Gemma-3-270M Q4_0
    in the Hugging Face cache (a snapshot of symlinks into blobs/, refs/main)."""
    root = tmp_path_factory.mktemp("home")
    q4_0 = resolve("smollm2-135m-q4_0", progress=False)
    gemma = resolve("gemma3-270m-q4_0", progress=False)
    ollama = root / ".ollama" / "models"
    blob = _ollama(ollama, "smollm2", "135m", smollm2_path)
    partial = root / "partial.gguf"
    with smollm2_path.open("rb") as f:
        partial.write_bytes(f.read(3 << 20))  # the first 3 MiB: header whole, tensors cut
    _ollama(ollama, "someone/cut", "latest", smollm2_path, blob=partial)
    partial.unlink()
    lms = root / ".lmstudio" / "models" / LMSTUDIO_REPO
    link_or_copy(q4_0, lms / "SmolLM2-135M-Instruct-Q4_0.gguf")
    (lms / "mmproj-SmolLM2-f16.gguf").write_bytes(b"GGUF")
    hub = root / ".cache" / "huggingface" / "hub" / f"models--{HF_REPO.replace('/', '--')}"
    sha = hash_file(gemma)
    link_or_copy(gemma, hub / "blobs" / sha)
    revision = "0123456789abcdef0123456789abcdef01234567"
    link = hub / "snapshots" / revision / "gemma-3-270m-Q4_0.gguf"
    link.parent.mkdir(parents=True)
    link.symlink_to(Path("..") / ".." / "blobs" / sha)
    (hub / "refs").mkdir()
    (hub / "refs" / "main").write_text(revision)
    return {"root": root, "ollama_blob": blob, "lmstudio": lms, "hf": link}


@pytest.fixture
def in_home(home: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This process sees only the temporary home's stores: an edge_spec cache without the
    registry models (its device profiles and load verdicts kept, so nothing is re-measured)."""
    from edge_spec.files import cache_dir

    cache = tmp_path / "edge_spec_cache"
    cache.mkdir()
    for entry in cache_dir().iterdir() if cache_dir().is_dir() else ():
        if entry.name != "models":
            (cache / entry.name).symlink_to(entry)
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(cache))
    # No draft head: one trained by another test of this worker would take the learned-draft
    # slot of the same SmolLM2 file, and the draft chosen from the stores is what is checked.
    monkeypatch.setenv("EDGE_SPEC_HEADS", str(tmp_path / "heads"))
    monkeypatch.setenv("HOME", str(home["root"]))
    for name in STORE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home["root"]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_scan_lists_each_stores_models_by_the_names_they_load_with(in_home, home) -> None:
    found = {f.name: f for f in stores.scan()}
    assert set(found) == {OLLAMA_NAME, "ollama:someone/cut:latest", LMSTUDIO_NAME, HF_NAME}
    assert found[OLLAMA_NAME].path == home["ollama_blob"]
    assert found[HF_NAME].path == home["hf"]
    facts = stores.model_facts(found[OLLAMA_NAME].path)
    assert facts.architecture == "llama" and facts.quantization == "F16"
    assert facts.chat_template and facts.n_ctx_train == 8192 and 1e8 < facts.n_params < 2e8
    q4_0 = stores.model_facts(found[LMSTUDIO_NAME].path)
    gemma = stores.model_facts(found[HF_NAME].path)
    assert q4_0.vocab_fingerprint == facts.vocab_fingerprint != gemma.vocab_fingerprint
    assert q4_0.quantization == "Q4_0" and gemma.architecture == "gemma3"


def test_store_names_resolve_to_their_files(in_home, home) -> None:
    assert resolve(OLLAMA_NAME) == home["ollama_blob"]
    assert resolve(f"lmstudio:{LMSTUDIO_REPO}") == resolve(LMSTUDIO_NAME)  # its only model
    assert resolve(f"hf:{HF_REPO}") == home["hf"]
    with pytest.raises(ModelFileError, match="closest: ollama:smollm2:135m"):
        resolve("ollama:smollm2")  # :latest is not there
    with pytest.raises(ModelFileError, match="in your local stores: ollama:smollm2:135m"):
        resolve("smollm2")  # a bare word that is no manifest name nor file
    # A half-downloaded blob: the existing validation refuses it, naming the store's name.
    with pytest.raises(ModelFileError, match=r"ollama:someone/cut \(ollama store\)"):
        resolve("ollama:someone/cut")


def test_a_draft_is_chosen_for_a_target_given_alone(in_home, home) -> None:
    before = _tree(in_home)
    target, draft, choice = pick_pair(OLLAMA_NAME, None)
    assert (target, draft) == (OLLAMA_NAME, LMSTUDIO_NAME)
    assert choice is not None and "same vocabulary" in choice.reason
    # Gemma-3 alone: SmolLM2's F16 is larger than half of it, its Q4_0 speaks another
    # vocabulary, through the cross-vocabulary path.
    _, draft, choice = pick_pair(HF_NAME, None)
    assert draft == LMSTUDIO_NAME and "another vocabulary" in choice.reason
    # A draft given, a draft-free mode, a manifest name: no choice is made.
    assert pick_pair(OLLAMA_NAME, HF_NAME)[2] is None
    assert pick_pair(OLLAMA_NAME, None, draft_mode="ngram")[1:] == (None, None)
    with pytest.raises(InvalidRequestError, match="give --draft"):
        pick_pair(LMSTUDIO_NAME, None, draft_mode="model")  # nothing half its size
    assert _tree(in_home) == before  # the stores are only read


def test_the_cli_and_the_api_load_store_names(in_home, home) -> None:
    """The same output by store name as by path; the chosen draft printed, in --json."""
    from edge_spec import EdgeSpec, EngineConfig

    env = dict(os.environ)
    cli = [sys.executable, "-m", "edge_spec.cli"]
    scan = subprocess.run(
        [*cli, "models", "scan", "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert scan.returncode == 0, scan.stderr
    rows = {row["name"]: row for row in json.loads(scan.stdout)}
    assert (
        rows[HF_NAME]["architecture"] == "gemma3" and "error" in rows["ollama:someone/cut:latest"]
    )
    ranked = subprocess.run(
        [*cli, "models", "scan", "--drafts-for", OLLAMA_NAME],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert ranked.returncode == 0 and ranked.stdout.startswith(f"1. {LMSTUDIO_NAME}")

    def generate(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [*cli, "generate", *args, "--json", "-n", "12", "The three primary colors are"]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)

    by_name = generate("-m", OLLAMA_NAME)
    assert by_name.returncode == 0, by_name.stderr
    assert f"draft: {LMSTUDIO_NAME}: same vocabulary" in by_name.stderr
    out = json.loads(by_name.stdout)
    assert out["draft_choice"].startswith(LMSTUDIO_NAME) and out["draft"] == str(
        home["lmstudio"] / "SmolLM2-135M-Instruct-Q4_0.gguf"
    )
    by_path = generate("-m", str(home["ollama_blob"]), "--draft-mode", "none")
    assert by_path.returncode == 0, by_path.stderr
    assert json.loads(by_path.stdout)["token_ids"] == out["token_ids"]
    unknown = generate("-m", "ollama:smolm2:135m")
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1
    assert "closest: ollama:smollm2:135m" in unknown.stderr

    with EdgeSpec(HF_NAME, "auto", config=EngineConfig(n_ctx=256)) as spec:
        assert spec.target_path == home["hf"] and spec.draft_choice is not None
        assert spec.draft_choice.draft == LMSTUDIO_NAME
        result = spec.generate(
            "The three primary colors are", max_tokens=12, k=3, draft_mode="model"
        )
        assert result.draft_vocab == "translated"
        alone = spec.generate("The three primary colors are", max_tokens=12, draft_mode="none")
        assert len(alone.token_ids) == 12


def test_the_server_serves_a_store_name_and_says_which_draft(in_home) -> None:
    """`edge-spec serve -m ollama:...`: listed under that name, with the chosen draft and why
    in /v1/models, and answering the official openai client."""
    from edge_spec.bench.outside import running_server

    with running_server(["-m", OLLAMA_NAME]) as (_, client, model):
        assert model == OLLAMA_NAME
        card = client.models.list().data[0]
        details = card.model_extra["edge_spec"]
        assert details["draft_choice"].startswith(f"{LMSTUDIO_NAME}: same vocabulary")
        done = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert done.choices[0].message.content


def test_a_path_to_a_manifest_models_file_keeps_its_manifest_pair() -> None:
    """No local choice where the manifest has a pair: by name or by its file's path."""
    path = str(resolve("gemma3-270m-f16", progress=False))
    assert pick_pair(path, None) == (path, "gemma3-270m-q4_0", None)
    assert pick_pair("gemma3-270m-f16", None) == ("gemma3-270m-f16", "gemma3-270m-q4_0", None)

"""Can this draft's token ids be handed to this target? The same rules as llama.cpp's
common_speculative_are_compatible, with an error that names the first mismatch."""

from __future__ import annotations

from pathlib import Path

from edge_spec.backend import LlamaModel
from edge_spec.errors import VocabMismatchError
from edge_spec.gguf.validate import validate_gguf

MAX_VOCAB_SIZE_DIFFERENCE = 128
CHECK_START_TOKEN_ID = 5  # ids below this are control tokens that may legitimately differ


def check_compatible(target: LlamaModel, draft: LlamaModel) -> None:
    """Raises VocabMismatchError unless the draft shares the target's vocabulary."""
    t, d = target.info, draft.info
    where = f"target {t.path.name} vs draft {d.path.name}"
    if t.vocab_type != d.vocab_type:
        raise VocabMismatchError(f"vocab type differs ({t.vocab_type} vs {d.vocab_type}): {where}")
    if t.add_bos != d.add_bos or (t.add_bos and t.bos_id != d.bos_id):
        raise VocabMismatchError(
            f"BOS differs (add_bos {t.add_bos}/{d.add_bos}, id {t.bos_id}/{d.bos_id}): {where}"
        )
    if t.eos_id != d.eos_id:
        raise VocabMismatchError(f"EOS id differs ({t.eos_id} vs {d.eos_id}): {where}")
    if abs(t.n_vocab - d.n_vocab) > MAX_VOCAB_SIZE_DIFFERENCE:
        raise VocabMismatchError(
            f"vocab sizes differ by more than {MAX_VOCAB_SIZE_DIFFERENCE} "
            f"({t.n_vocab} vs {d.n_vocab}): {where}"
        )
    # The same token texts stored in both files (the usual pair: one model, two quantizations)
    # pass the loop below; it reads 262,144 texts through llama.cpp in 0.3 s.
    digest = validate_gguf(t.path).vocab_sha256
    if digest and digest == validate_gguf(d.path).vocab_sha256:
        return
    for token in range(CHECK_START_TOKEN_ID, min(t.n_vocab, d.n_vocab)):
        t_text, d_text = target.token_text(token), draft.token_text(token)
        if t_text != d_text:
            raise VocabMismatchError(f"token {token} differs ({t_text!r} vs {d_text!r}): {where}")


def relation_from_files(target_path: Path, draft_path: Path) -> str | None:
    """What check_compatible will find, read from the two files' validated metadata without
    loading the draft: "shared" when the token texts (their digest), every tokenizer.ggml key
    and the architecture are the same (llama.cpp builds the same vocabulary from them),
    "translated" when the tokenizer types differ or the sizes differ by more than
    MAX_VOCAB_SIZE_DIFFERENCE, None when only the loaded models can tell."""
    t, d = validate_gguf(target_path), validate_gguf(draft_path)

    def tokenizer(meta: dict) -> dict:
        return {k: v for k, v in meta.items() if k.startswith("tokenizer.ggml.")}

    if (
        t.vocab_sha256
        and t.vocab_sha256 == d.vocab_sha256
        and tokenizer(t.metadata) == tokenizer(d.metadata)
        and t.metadata.get("general.architecture") == d.metadata.get("general.architecture")
    ):
        return "shared"
    t_kind, d_kind = t.metadata.get("tokenizer.ggml.model"), d.metadata.get("tokenizer.ggml.model")
    if t_kind and d_kind and t_kind != d_kind:
        return "translated"
    if abs(t.n_vocab - d.n_vocab) > MAX_VOCAB_SIZE_DIFFERENCE:
        return "translated"
    return None

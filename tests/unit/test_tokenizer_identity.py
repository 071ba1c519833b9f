"""The tokenizer's identity (`tokenizer_identity`): what a shard's token ids depend on besides its text."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagster_project.tokenizer import (
    BUILTIN_TOKENIZER,
    TokenizerIdentity,
    TokenizerMismatch,
    load_tokenizer,
    refuse_other_tokenizer,
    tokenizer_identity,
)
from tests.support.tokenizer_copies import USER_TURNS_PREFIXED, tokenizer_copy


def identity_of(path: Path) -> TokenizerIdentity:
    return tokenizer_identity(load_tokenizer(str(path)))


def test_the_same_tokenizer_has_the_same_identity_wherever_it_is_read_from(tmp_path):
    builtin = tokenizer_identity(load_tokenizer(BUILTIN_TOKENIZER))
    copy = identity_of(tokenizer_copy(tmp_path / "copy"))

    assert builtin.known and builtin.name == BUILTIN_TOKENIZER and copy.name == str(tmp_path / "copy")
    assert copy.fingerprint == builtin.fingerprint and not copy.differs_from(builtin)
    assert tokenizer_identity(load_tokenizer(BUILTIN_TOKENIZER)) == builtin  # stable: computed again, the same


def test_an_edited_chat_template_changes_the_fingerprint_and_is_named(tmp_path):
    builtin = tokenizer_identity(load_tokenizer(BUILTIN_TOKENIZER))
    edited = identity_of(tokenizer_copy(tmp_path / "edited", template_edit=USER_TURNS_PREFIXED))

    assert edited.differs_from(builtin)
    assert edited.differences(builtin) == ["chat template"]
    assert (edited.vocabulary, edited.special_tokens) == (builtin.vocabulary, builtin.special_tokens)
    with pytest.raises(TokenizerMismatch) as refused:
        refuse_other_tokenizer(edited, builtin, "completions shard 1", "regenerate it")
    line = str(refused.value)
    assert edited.fingerprint in line and builtin.fingerprint in line and "chat template differs" in line
    refuse_other_tokenizer(builtin, tokenizer_identity(load_tokenizer(BUILTIN_TOKENIZER)), "shard 0", "")  # same


def test_another_end_of_sequence_token_changes_the_fingerprint(tmp_path):
    builtin = tokenizer_identity(load_tokenizer(BUILTIN_TOKENIZER))
    other = identity_of(tokenizer_copy(tmp_path / "eos", eos_token="<|endoftext|>"))

    assert other.differs_from(builtin) and other.differences(builtin) == ["special tokens"]


def test_an_unknown_identity_is_never_a_mismatch():
    known = tokenizer_identity(load_tokenizer(BUILTIN_TOKENIZER))
    unknown = TokenizerIdentity()  # what a manifest written before tokenizers were recorded reads back as

    assert not unknown.known and not unknown.differs_from(known) and not known.differs_from(unknown)
    assert unknown.label() == "unknown (not recorded)"

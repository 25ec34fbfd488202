"""The built-in corpus's tokens are cached per tokenizer: a second run reads the same tokens instead of
generating and tokenizing the stories again, and another tokenizer gets its own entry."""

from __future__ import annotations

import numpy as np

from anekit.llama import data
from anekit.llama.tokenizer import default_tokenizer


def test_the_corpus_tokens_come_back_from_the_cache_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("ANEKIT_CACHE", str(tmp_path / "cache"))
    tok = default_tokenizer(vocab_size=512, cache_dir=tmp_path / "tok")
    other = default_tokenizer(vocab_size=1024, cache_dir=tmp_path / "tok")
    first = data.default_dataset(tok, seed=0, n_stories=200)
    path = data.corpus_cache_path(tok, 0, 200)
    assert path is not None and path.is_file()
    want = data.tokenize_stories(data.corpus.generate_corpus(200, 0), tok)  # independent of the cache
    np.testing.assert_array_equal(first.parts[0][1], want)

    def no_generation(*_: object) -> str:
        raise AssertionError("the corpus was generated again")

    monkeypatch.setattr(data.corpus, "generate_corpus", no_generation)
    again = data.default_dataset(tok, seed=0, n_stories=200)
    np.testing.assert_array_equal(again.parts[0][1], want)
    assert data.corpus_cache_path(other, 0, 200) != path
    assert data.corpus_cache_path(tok, 1, 200) != path

"""Okapi BM25 in numpy: the lexical search behind SearchQA-mini (searchqa.py) and WebShop-mini (webshop.py).

What it implements: the official environments search with pyserini / Lucene (WebShop) and a dense retriever over
Wikipedia (SearchQA); both minis use this BM25 with pyserini's defaults (k1 0.9, b 0.4) and Lucene's English stop
words. Our own code rather than a package: `rank-bm25` is unmaintained since 2022 (and uses a different idf rule),
`bm25s` needs scipy; this is ~40 lines a test checks by hand (tests/test_searchqa.py, tests/test_webshop.py).
Leaves out: Lucene's Porter stemmer (an analyzer can stem: webshop.terms does plurals), phrase and boolean queries.
Run: imported only.
"""
from __future__ import annotations

import re
from collections import Counter

import numpy as np

# Lucene's default English stop words (pyserini's default analyzer)
STOP_WORDS = frozenset("a an and are as at be but by for if in into is it no not of on or such that the their "
                       "then there these they this to was will with".split())
K1, B = 0.9, 0.4          # pyserini's BM25 defaults (the official WebShop search uses them)


def tokenize(text: str) -> list[str]:
    """Lower-cased alphanumeric runs without stop words (the default analyzer)."""
    return [t for t in re.findall(r"[a-z0-9]+", text.lower()) if t not in STOP_WORDS]


class BM25:
    """Okapi BM25 over a list of documents, with Lucene's never-negative idf:
        idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
        score(q, d) = sum over query tokens t of  idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + k1 * L(d)),
        L(d) = 1 - b + b * |d| / avgdl      (|d| = document length in tokens)
    A repeated query token counts again (as Lucene); unknown tokens add 0. `analyzer` turns a text into tokens
    (documents and queries alike)."""

    def __init__(self, docs: list[str], k1: float = K1, b: float = B, analyzer=tokenize):
        self.analyzer = analyzer
        toks = [analyzer(d) for d in docs]
        self.vocab = {t: i for i, t in enumerate(dict.fromkeys(t for doc in toks for t in doc))}
        self.tf = np.zeros((len(docs), len(self.vocab)))                # (N, V) term counts
        for i, doc in enumerate(toks):
            for t, c in Counter(doc).items():
                self.tf[i, self.vocab[t]] = c
        dl = self.tf.sum(1)                                              # (N,) document lengths in tokens
        df = (self.tf > 0).sum(0)                                        # (V,) document frequencies
        self.idf = np.log(1 + (len(docs) - df + 0.5) / (df + 0.5))       # (V,)
        self.norm = k1 * (1 - b + b * dl / max(dl.mean(), 1e-9))         # (N,) length normalisation
        self.k1 = k1

    def scores(self, query: str) -> np.ndarray:
        """(N,) BM25 score of every document for the query."""
        out = np.zeros(self.tf.shape[0])
        for t in self.analyzer(query):
            if t in self.vocab:
                tf = self.tf[:, self.vocab[t]]
                out += self.idf[self.vocab[t]] * tf * (self.k1 + 1) / (tf + self.norm)
        return out

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """Top-k (doc index, score) with score > 0, best first; ties go to the lower index (Lucene: docid)."""
        s = self.scores(query)
        return [(int(i), float(s[i])) for i in np.argsort(-s, kind="stable")[:k] if s[i] > 0]

    def top(self, query: str, k: int) -> list[int]:
        """Indices of the top-k documents (see `search`)."""
        return [i for i, _ in self.search(query, k)]

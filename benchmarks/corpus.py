"""Realistic English-like sentences for benchmarks, made offline and deterministically.

Sentence lengths follow a log-normal fitted to news text (mean ~25 tokens, long tail to ~80); words
are drawn Zipf-style from a list of common English words and punctuation, so token lengths and
the share of repeated tokens look like real text (which matters to caches of distinct tokens).
"""

from __future__ import annotations

import numpy as np

_WORDS = """the , . of and to a in that is for it was on with he as i his be at by 's you had not are but
from or have an they which one were her all she there would their we him been has when who will more no if
out so said what up its about into than them can only other new some could time these two may then do first
any my now such like our over man me even most made after also did many before must through back years where
much your way well down should because each just those people mr how too little state good very make world
still own see men work long get here between both life being under never day same another know while last
might us great old year off come since against go came right used take three states himself few house use
during without again place american around however home small found mrs thought went say part once general
high upon school every don't does got united left number course war until always away something fact though
water less public put thing almost hand enough far took head yet government system better set told nothing
night end why called didn't eyes find going look asked later knew point next program city business give group
toward young days let room president side social given present several order national possible rather second
face per among form important often things looked early white case john become large big need four within felt
along children saw best church ever least power development light thought seemed family interest want members
mind country area others done turned although open god service certain kind problem began different door thus
help sense means whole matter perhaps itself york it's times law human line above name example action company
hands local show whether five history gave today either act feet across taken past quite anything having seen
death experience body word half really week field am car words already themselves information tell together
college shall money period held keep sure probably free seems real behind cannot miss political air question
making office brought whose special major heard problems federal became study ago moment available known result
street economic boy reason change position south board individual job areas society west close turn love community
true court force full seem am wife future age voice center woman control common policy necessary following front
sometimes six girl clear further land run students provide military similar particular dark spirit ; : " ( ) ?
-- ' ! $ 1990 2009 % percent million billion officials according spokesman reported announced Tuesday Wednesday
Thursday Friday Monday international administration congress committee department investigation organization
""".split()


def make_sentences(n: int, seed: int = 0, mean_tokens: float = 25.0) -> list[list[str]]:
    """n tokenized sentences, mean length about ``mean_tokens`` (at least 1, at most 120)."""
    rng = np.random.default_rng(seed)
    sigma = 0.5
    mu = np.log(mean_tokens) - sigma**2 / 2
    lengths = np.clip(np.round(rng.lognormal(mu, sigma, n)), 1, 120).astype(int)
    ranks = np.arange(1, len(_WORDS) + 1)
    p = 1.0 / ranks
    p /= p.sum()
    out = []
    for length in lengths:
        words = list(rng.choice(_WORDS, size=length, p=p))
        if rng.random() < 0.3:  # a capitalised first word, as sentences have
            words[0] = words[0].capitalize()
        out.append(words)
    return out

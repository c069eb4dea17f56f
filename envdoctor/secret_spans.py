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
# forms; more cost more as one alternation than a text's pass over the index (helper-72: per
# megabyte of log, 0.37 s with 8 forms, 1.0 with 64, 4.0 with 256, against 0.2 indexed)
INDEX_ABOVE = 16
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

    __slots__ = ("search", "_wholes", "_starts", "_overlapping", "_fragments", "_tails")

    def __init__(self, forms: dict[str, int]):
        ordered = sorted(forms, key=len, reverse=True)  # a longer form that holds a shorter one wins
        # every form, and apart, the credentials' first characters (their cut quotes' starts)
        self._wholes = "|".join(whole(f, forms[f]) for f in ordered)
        self._starts = "|".join(sorted({re.escape(f[:FRAGMENT_LENGTH]) for f in ordered if has_fragment(f, forms[f])}))
        self.search = re.compile("|".join(filter(None, (self._wholes, self._starts)))).search
        self._overlapping: re.Pattern[str] | None = None
        self._fragments: re.Pattern[str] | None = None
        # forms a word end may cut short: a fragment of one is masked as far as the text agrees
        self._tails: dict[str, list[str]] = {}
        for form in ordered:
            if has_fragment(form, forms[form]) and _WORD_END.search(form, FRAGMENT_LENGTH):
                self._tails.setdefault(form[:FRAGMENT_LENGTH], []).append(form)

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
                budget = 4 * len(text) + 65536  # characters compared for _tails, then masked as if they agreed
                for start in starts:
                    after = bisect.bisect_left(word_ends, start + FRAGMENT_LENGTH)
                    end = word_ends[after] if after < len(word_ends) else len(text)
                    for form in self._tails.get(text[start:start + FRAGMENT_LENGTH], ()):
                        agreed = _agreement(text, start, form) if budget > 0 else len(form)
                        budget -= agreed
                        end = max(end, min(len(text), start + agreed))
                    found.append((start, end))
                found.sort()
        merged: list[tuple[int, int]] = []
        for start, end in found:
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return merged


def _agreement(text: str, at: int, form: str) -> int:
    """How many characters of `form` the text at `at` agrees with (its first FRAGMENT_LENGTH, known).
    A credential holding a delimiter (a PEM body's line breaks, a value with '; ' in it), glued
    to a word or quoted cut short, was masked only to the first one (helper-72: 300 of 323
    characters shown). Binary search on the part not yet known to agree: about 2x the
    agreeing length compared."""
    low, high = FRAGMENT_LENGTH, min(len(form), len(text) - at)
    while low < high:
        middle = (low + high + 1) // 2
        if text.startswith(form[low:middle], at + low):
            low = middle
        else:
            high = middle - 1
    return low


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
        """The matcher of the forms that occur in `text` (or, a credential's, whose first
        FRAGMENT_LENGTH characters do), and of the short ones. Found from the text's
        GRAM-character pieces that start a form, each place checked with startswith: taken
        whole into the pattern, every form whose start the text holds made one alternation
        as long as the text was random (helper-72: 2,700 of 100,000 values for 400 KB of
        base64, 10 s)."""
        get = self._index.get
        found = dict(self._short)
        for at in range(len(text) - GRAM + 1):
            forms = get(text[at:at + GRAM])
            if forms is not None:
                for form, kind in forms.items():
                    if form not in found and (text.startswith(form, at) or (
                            has_fragment(form, kind) and text.startswith(form[:FRAGMENT_LENGTH], at))):
                        found[form] = kind
        if not found:
            return None
        key = frozenset(found)
        matcher = self._matchers.get(key)
        if matcher is None:
            if len(self._matchers) >= _MATCHERS_KEPT:
                self._matchers.clear()
            matcher = self._matchers[key] = _Matcher(found)
        return matcher

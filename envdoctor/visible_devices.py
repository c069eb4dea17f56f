"""CUDA_VISIBLE_DEVICES read the way the CUDA driver reads it.

The rules, as PyTorch models them in torch.cuda._parse_visible_devices and
_transform_uuid_to_ordinals (checked there against the 525 driver; see
pytorch/pytorch#90543 and #92315), and as the CUDA programming guide describes:

* The value is a comma-separated list. If it starts with `GPU-` it is a list of
  GPU UUIDs; if it starts with `MIG-`, of MIG device UUIDs; otherwise of indices.
  The kinds do not mix: in an index list a `GPU-...` entry is invalid, and in a
  UUID list an entry without the prefix is.
* An index entry is read like C's strtoul: surrounding blanks are ignored, an
  optional sign, then digits; characters after the digits are ignored
  (`1gpu2` reads as 1). An entry with no digits, or a negative number, is invalid.
* A UUID entry may be any unique prefix of a device's UUID (`GPU-8932f9`); one
  that matches no device, or several, is invalid.
* The first invalid entry ends the list: it and everything after it are
  ignored. `-1` is the usual way to write "no GPU" on purpose.
* The same device listed twice hides every device.
* An index at or beyond the number of GPUs ends the list like an invalid entry.

`parse()` applies the rules that need no GPU; `resolve()` applies the ones that
need the node's GPUs (count and UUIDs, from NVML). Both take plain values and do
no I/O; `parse` raises ParseError only, for input that is not a string.
"""

from __future__ import annotations

import re
from collections import namedtuple

from envdoctor.errors import ParseError

_BLANKS = " \t\n\r\f\v"
_NUMBER = re.compile(r"([+-]?)([0-9]+)")
MAX_INDEX_DIGITS = 18  # an index with more digits is beyond any GPU count (and int() refuses > 4300 digits)

INDEX, GPU_UUID, MIG_UUID = "index", "gpu_uuid", "mig_uuid"


class VisibleDevices(namedtuple("VisibleDevices", (
        "raw",  # str
        "mode",  # str: INDEX, GPU_UUID or MIG_UUID
        "tokens",  # tuple[str, ...]: the comma-separated entries, as written
        "visible",  # tuple[int | str, ...]: the entries CUDA will use, in order (ints or UUID prefixes)
        "stop",  # int | None = None: position in `tokens` of the entry that ended the list
        "stop_reason",  # str | None = None
        "duplicate",  # int | str | None = None: a device listed twice: CUDA then exposes none
        "lenient",  # tuple[tuple[str, int], ...] = (): entries read as a number despite trailing text
        "quoted",  # bool = False: the value holds quote characters (left by an env file or YAML)
), defaults=(None, None, None, (), False))):
    """What CUDA makes of one CUDA_VISIBLE_DEVICES value, before looking at the GPUs."""

    __slots__ = ()

    @property
    def bad_token(self) -> str | None:
        return None if self.stop is None else self.tokens[self.stop]

    @property
    def ignored(self) -> tuple[str, ...]:
        """The entries after the one that ended the list (what the user lost)."""
        return () if self.stop is None else self.tokens[self.stop + 1:]

    @property
    def hides_all(self) -> bool:
        return not self.visible


def parse(value: str) -> VisibleDevices:
    """Parse a CUDA_VISIBLE_DEVICES value; raise ParseError only if it is not text."""
    if not isinstance(value, str):
        raise ParseError(f"CUDA_VISIBLE_DEVICES must be text, got {type(value).__name__}")
    tokens = tuple(value.split(","))
    quoted = '"' in value or "'" in value
    if value.startswith("GPU-") or value.startswith("MIG-"):
        return _parse_uuids(value, tokens, quoted)
    return _parse_indices(value, tokens, quoted)


def _parse_uuids(value: str, tokens: tuple[str, ...], quoted: bool) -> VisibleDevices:
    prefix = value[:4]
    mode = GPU_UUID if prefix == "GPU-" else MIG_UUID
    seen: dict[str, None] = {}  # ordered, and a membership test costs O(1): 20,000 entries stay linear
    for i, token in enumerate(tokens):
        if token in seen:
            return VisibleDevices(value, mode, tokens, (), duplicate=token, quoted=quoted)
        if not token.startswith(prefix):
            reason = "empty entry" if not token.strip(_BLANKS) else f"does not start with {prefix} like the first entry"
            return VisibleDevices(value, mode, tokens, tuple(seen), stop=i, stop_reason=reason, quoted=quoted)
        seen[token] = None
    return VisibleDevices(value, mode, tokens, tuple(seen), quoted=quoted)


def _parse_indices(value: str, tokens: tuple[str, ...], quoted: bool) -> VisibleDevices:
    seen: dict[int, None] = {}  # ordered, O(1) membership: the parse is linear in the entries
    lenient: list[tuple[str, int]] = []
    for i, token in enumerate(tokens):
        text = token.strip(_BLANKS)
        match = _NUMBER.match(text)
        if match is None:
            reason = "empty entry" if not text else "not a GPU index"
            if text.startswith(("GPU-", "MIG-")):
                reason = "a UUID in a list of indices (CUDA does not mix the two)"
            return VisibleDevices(value, INDEX, tokens, tuple(seen), stop=i, stop_reason=reason,
                                  lenient=tuple(lenient), quoted=quoted)
        digits = match.group(2).lstrip("0") or "0"
        if len(digits) > MAX_INDEX_DIGITS:  # strtoul saturates: no GPU has such an index, and CUDA stops here
            return VisibleDevices(value, INDEX, tokens, tuple(seen), stop=i, stop_reason="not a GPU index (far too large)",
                                  lenient=tuple(lenient), quoted=quoted)
        number = int(digits)
        if match.group(1) == "-":
            number = -number
        if number in seen:
            return VisibleDevices(value, INDEX, tokens, (), duplicate=number, lenient=tuple(lenient), quoted=quoted)
        if number < 0:
            return VisibleDevices(value, INDEX, tokens, tuple(seen), stop=i, stop_reason="negative index",
                                  lenient=tuple(lenient), quoted=quoted)
        if match.end() < len(text):
            lenient.append((token, number))
        seen[number] = None
    return VisibleDevices(value, INDEX, tokens, tuple(seen), lenient=tuple(lenient), quoted=quoted)


class Resolution(namedtuple("Resolution", (
        "ordinals",  # tuple[int, ...]: positions in the device (or MIG device) list, in CUDA's order
        "missing",  # int | str | None = None: the first entry that names no device (ends the list)
        "ambiguous",  # str | None = None: a UUID prefix that matches several devices (ends the list)
        "duplicate",  # int | None = None: two entries naming one device: CUDA exposes none
        "hidden",  # tuple[int | str, ...] = (): parsed entries lost after `missing`/`ambiguous`
        "unverifiable",  # tuple[str, ...] = (): entries that cannot be matched here
), defaults=(None, None, None, (), ()))):
    """Which physical devices CUDA will use, once the node's GPUs are known."""

    __slots__ = ()


def resolve(parsed: VisibleDevices, count: int, uuids: list[str] | tuple[str, ...] = (),
            mig_uuids: list[str] | tuple[str, ...] = ()) -> Resolution:
    """Apply the rules that need the GPUs: `count` devices with these UUIDs (GPU-...),
    and these MIG device UUIDs (MIG-...) in enumeration order."""
    if parsed.duplicate is not None:
        return Resolution(())
    entries = list(parsed.visible)
    if parsed.mode == INDEX:
        for i, index in enumerate(entries):
            if index >= count:
                return Resolution(tuple(entries[:i]), missing=index, hidden=tuple(entries[i + 1:]))
        return Resolution(tuple(entries))
    known = list(uuids) if parsed.mode == GPU_UUID else list(mig_uuids)
    if parsed.mode == MIG_UUID and any(e.startswith("MIG-GPU-") for e in entries):
        # The pre-R470 MIG-GPU-<uuid>/<gi>/<ci> form: NVML no longer reports names like it.
        return Resolution((), unverifiable=tuple(e for e in entries if e.startswith("MIG-GPU-")))
    ordinals: list[int] = []
    taken: set[int] = set()
    for i, candidate in enumerate(entries):
        # a bare "GPU-" names no device: CUDA found none (an H200, driver 580), though every
        # UUID starts with it and torch.cuda.device_count() counted 1
        matches = [n for n, uuid in enumerate(known) if uuid.startswith(candidate)] if candidate[4:] else []
        if len(matches) != 1:
            rest = tuple(entries[i + 1:])
            if not matches:
                return Resolution(tuple(ordinals), missing=candidate, hidden=rest)
            return Resolution(tuple(ordinals), ambiguous=candidate, hidden=rest)
        if matches[0] in taken:
            return Resolution((), duplicate=matches[0])
        ordinals.append(matches[0])
        taken.add(matches[0])
    return Resolution(tuple(ordinals))

"""Text a trainer printed, made safe to show on a terminal or a page.

A trial's log tail and error come from programs parsearch did not write. Shown raw, their
escape sequences act on the user's terminal: change its title, clear the screen, erase or
overwrite lines, write the clipboard (OSC 52), hide text behind bidirectional overrides
(``evil\\u202etxt.exe``). So everything a trainer wrote goes through :func:`shown` before
``parsearch show``, ``status``, ``top``, ``trial`` or the report displays it:

* escape sequences are removed whole: CSI (``ESC [ ... final``, colours and cursor moves),
  OSC (``ESC ] ... BEL`` or ``ESC \\``: titles, hyperlinks, the clipboard), DCS, SOS, PM and
  APC strings, two-character escapes, and their 8-bit C1 forms (``\\x9b``, ``\\x9d``, ...);
* every other control character goes, except newline and tab; a carriage return (a progress
  bar redrawing its line, or a line hiding what precedes it) becomes a newline;
* bidirectional controls, zero-width characters and line separators are shown visibly, as
  ``<U+202E>``, so the text reads in the order it was written.

The raw log stays on disk (and the store keeps what the trainer wrote): only what is shown
changes.
"""

from __future__ import annotations

import re

# ESC-introduced sequences (7-bit) and their C1 equivalents (8-bit), removed whole. String
# sequences (OSC, DCS, SOS, PM, APC) run to BEL or ST (ESC \ or \x9c), or to the end of the text
# when unterminated (a cut log tail).
_STRING = r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c|$)"
_CSI = r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
_OTHER_ESCAPE = r"\x1b[\x20-\x2f]*[\x30-\x7e]?"
_SEQUENCE = re.compile(f"{_STRING}|{_CSI}|{_OTHER_ESCAPE}")
# Controls left after the sequences: C0 but tab and newline, DEL and C1.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Shown as <U+XXXX>: bidirectional embeddings, overrides, isolates and marks; zero-width
# characters; line and paragraph separators; the byte order mark in the middle of a text.
_INVISIBLE = re.compile(
    "[\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\U000e0000-\U000e007f]"
)


def shown(text: str | None) -> str:
    """``text`` as it may be shown: no escape sequence, no control but newline and tab, and
    invisible or reordering characters written out (see the module docstring)."""
    if not text:
        return ""
    text = text.replace("\r\n", "\n")
    text = _SEQUENCE.sub("", text)
    text = text.replace("\r", "\n")
    text = _CONTROL.sub("", text)
    return _INVISIBLE.sub(lambda match: f"<U+{ord(match.group()):04X}>", text)


def shown_line(text: str | None) -> str:
    """:func:`shown`, on one line (a reason in a table): newlines and tabs become spaces."""
    return re.sub(r"[\n\t]+", " ", shown(text)).strip()

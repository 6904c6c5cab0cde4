"""``shell: true`` templates: every filled value reaches the shell as data, never as text.

A shell template is one string for ``/bin/sh -c``. Quoting each value into the script
(``shlex.quote``) protects it only where the template leaves it unquoted, and knowing where
that is means lexing the shell: a quote inside a ``#`` comment, a here-document, a backquote,
``$(...)``, dash against bash... a check that re-implements the lexer always misses a case.
So no value is ever put in the script. Each placeholder becomes a reference to a shell
variable, ``PARSEARCH_<NAME>`` (the name upper-cased), and the values travel as the
positional parameters of ``sh -c``::

    /bin/sh -c 'PARSEARCH_TP=$1 PARSEARCH_DATA=$2; export PARSEARCH_TP PARSEARCH_DATA; shift 2;
                <the template, each {name} replaced by a reference>' /bin/sh 4 'a; touch pwned'

The prelude is parsearch's own text (an assignment never splits or globs), and a shell never
parses the result of a parameter expansion as syntax: wherever the template puts the
reference (quotes, a comment, a here-document, backquotes, ``$(...)``), the value is at most
split into words or matched as a pattern, never run. The variables of the placeholders the
template names (anywhere, a comment included) are exported, so a program it starts can read
them too (``python -c 'import os; print(os.environ["PARSEARCH_TP"])'  # {tp}``, or
``sh <<'EOF'`` ... ``$PARSEARCH_TP`` ... ``EOF``): the safe way to hand a value to code.

Which reference each placeholder gets only decides how faithfully the value is kept, never
whether it is safe, so a small scan of the template guesses its surroundings:
``"${PARSEARCH_X}"`` outside quotes (one word, as before), ``${PARSEARCH_X}`` inside double
quotes, inside ``$((...))`` and in a here-document's body, ``'"${PARSEARCH_X}"'`` inside single
quotes (the quotes are closed around it). The same scan gives *advice* (load-time warnings,
never errors) where a value ends up as code for another reader: ``eval``, bash's arithmetic
(which evaluates a non-numeric value as an expression), a here-document, a backslash before
the placeholder. What the template itself asks a second interpreter to run (``eval``,
``sh -c``, ``python -c``) gets the value as text, as it would without a shell: pass values to
such code through the exported variables.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SHELL = "/bin/sh"
PREFIX = "PARSEARCH_"

# Where a placeholder sits, as the scan guesses it.
PLAIN, DOUBLE, SINGLE, ESCAPED, HEREDOC, LITERAL_HEREDOC, ARITHMETIC, COMMENT = (
    "plain",
    "double",
    "single",
    "escaped",
    "heredoc",
    "literal-heredoc",
    "arithmetic",
    "comment",
)
_BARE = (DOUBLE, ESCAPED, HEREDOC, LITERAL_HEREDOC, ARITHMETIC)
_WORD_BREAK = set(" \t\n;&|()<>")
_EVAL = re.compile(r"(?:^|[\s;&|(`])eval\s")


def variable(name: str) -> str:
    """The shell variable that carries placeholder ``name``."""
    return PREFIX + name.upper()


def reference(name: str, where: str) -> str:
    """The text that stands for ``{name}`` in the script, given its surroundings."""
    var = "${" + variable(name) + "}"
    if where in _BARE:
        return var
    if where == SINGLE:
        return f"'\"{var}\"'"
    return f'"{var}"'


@dataclass(frozen=True)
class Placement:
    """One placeholder of a shell template and where the scan found it."""

    name: str
    where: str
    eval_before: bool = False


def scan(parts: Sequence[tuple[str, str | None]]) -> list[Placement]:
    """Where each placeholder of ``parts`` (literal, name) sits: a guess, used only to choose
    a faithful reference and to give advice. Safety never depends on it."""
    seq: list[str | int] = []
    names: list[str] = []
    for literal, name in parts:
        seq.extend(literal)
        if name is not None:
            seq.append(len(names))
            names.append(name)
    found: list[Placement] = []
    # Frames: [kind, depth]; kinds: top, cmd ($(...)), bq (`...`), dq, sq, arith, param (${...}).
    stack: list[list[Any]] = [["top", 0]]
    escaped = comment = False
    word_start = True
    pending: list[tuple[str, bool, bool]] = []  # here-documents announced on this line
    body: tuple[str, bool, bool] | None = None
    line: list[str] = []
    line_text = ""  # the current line so far, for the eval advice
    i, n = 0, len(seq)

    def at(k: int) -> str | int | None:
        return seq[k] if k < n else None

    while i < n:
        c = seq[i]
        if body is not None:  # a here-document's body, to its delimiter line
            if isinstance(c, int):
                found.append(Placement(names[c], LITERAL_HEREDOC if body[1] else HEREDOC))
                line.append("\0")
            elif c == "\n":
                text = "".join(line)
                if (text.lstrip("\t") if body[2] else text) == body[0]:
                    body = pending.pop(0) if pending else None
                line = []
            else:
                line.append(c)
            i += 1
            continue
        kind = stack[-1][0]
        if isinstance(c, int):
            if comment:
                where = COMMENT
            elif escaped:
                where = ESCAPED
            else:
                where = {"dq": DOUBLE, "sq": SINGLE, "arith": ARITHMETIC}.get(kind, PLAIN)
            found.append(Placement(names[c], where, bool(_EVAL.search(line_text))))
            escaped = word_start = False
            line_text += "x"
            i += 1
            continue
        line_text = "" if c == "\n" else line_text + c
        if comment:
            if c == "\n":
                comment = False
                word_start = True
                if pending:
                    body = pending.pop(0)
            i += 1
            continue
        if escaped:
            escaped = word_start = False
            i += 1
            continue
        if kind == "sq":
            if c == "'":
                stack.pop()
            i += 1
            continue
        if c == "\\":
            escaped = True
            i += 1
            continue
        nxt, nxt2 = at(i + 1), at(i + 2)
        if c == "$" and nxt == "(":
            stack.append(["arith" if nxt2 == "(" else "cmd", 0])
            i += 3 if nxt2 == "(" else 2
            word_start = kind != "dq"
            continue
        if c == "$" and nxt == "{":
            stack.append(["param", 0])
            i += 2
            continue
        if c == "`":
            if kind == "bq":
                stack.pop()
            else:
                stack.append(["bq", 0])
                word_start = True
            i += 1
            continue
        if kind == "dq":
            if c == '"':
                stack.pop()
            i += 1
            continue
        if kind == "arith":
            if c == "(":
                stack[-1][1] += 1
            elif c == ")":
                if stack[-1][1] == 0:
                    stack.pop()
                    i += 1 if nxt == ")" else 0
                else:
                    stack[-1][1] -= 1
            i += 1
            continue
        if kind == "param":
            if c == "}":
                stack.pop()
            elif c in "'\"":
                stack.append(["sq" if c == "'" else "dq", 0])
            i += 1
            continue
        # top, cmd, bq: unquoted command text
        if c in "'\"":
            stack.append(["sq" if c == "'" else "dq", 0])
        elif c == "#" and word_start:
            comment = True
        elif c == "(" and word_start and nxt == "(":
            stack.append(["arith", 0])  # bash's (( ... ))
            i += 1
        elif c == "(" and kind == "cmd":
            stack[-1][1] += 1
        elif c == ")" and kind == "cmd":
            if stack[-1][1] == 0:
                stack.pop()
            else:
                stack[-1][1] -= 1
        elif c == "<" and nxt == "<" and nxt2 != "<":
            i = _here_document(seq, i + 2, pending)
            word_start = True
            continue
        elif c == "\n" and pending:
            body = pending.pop(0)
        word_start = c in _WORD_BREAK
        i += 1
    return found


def _here_document(seq: list[str | int], i: int, pending: list[tuple[str, bool, bool]]) -> int:
    """Read a here-document operator's delimiter (after ``<<``); returns the next index."""
    strip = i < len(seq) and seq[i] == "-"
    i += strip
    while i < len(seq) and seq[i] in (" ", "\t"):
        i += 1
    word: list[str] = []
    quoted = False
    quote: str | None = None
    while i < len(seq):
        c = seq[i]
        if isinstance(c, int):
            word.append("\0")
        elif quote is not None:
            if c == quote:
                quote = None
            else:
                word.append(c)
        elif c in "'\"":
            quote, quoted = c, True
        elif c == "\\":
            quoted = True
        elif c in _WORD_BREAK:
            break
        else:
            word.append(c)
        i += 1
    if word:
        pending.append(("".join(word), quoted, strip))
    return i


def advice(placements: Sequence[Placement], numeric: Collection[str] = ()) -> list[str]:
    """Load-time warnings about where a template puts its placeholders (never errors);
    ``numeric``: placeholders whose value is always a number (safe in arithmetic)."""
    notes: dict[str, str] = {}
    for place in placements:
        ref = "$" + variable(place.name)
        say = f"placeholder {{{place.name}}}"
        if place.eval_before:
            notes.setdefault(
                place.name + "eval",
                f"{say} follows eval, which runs its value as shell code; pass it as "
                f'"{ref}" in the evaluated text instead',
            )
        if place.where == ARITHMETIC and place.name not in numeric:
            notes.setdefault(
                place.name + "arith",
                f"{say} is inside an arithmetic expression; bash evaluates a non-numeric value "
                "there as an expression (which can run commands): keep it to numeric "
                "placeholders",
            )
        if place.where == ESCAPED:
            notes.setdefault(
                place.name + "escaped",
                f"{say} follows a backslash: the shell sees the text {ref}, not the value; "
                "remove the backslash",
            )
        elif place.where == LITERAL_HEREDOC:
            notes.setdefault(
                place.name + "literal",
                f"{say} is in a here-document with a quoted delimiter, which the shell does not "
                f"expand: the document holds the text {ref} (a shell reading it finds the "
                "value in the environment)",
            )
        elif place.where == HEREDOC and place.name not in numeric:
            notes.setdefault(
                place.name + "heredoc",
                f"{say} is in a here-document: its value is written into the document as "
                "text; if a shell or another interpreter runs the document, quote the "
                f"delimiter (<<'EOF') and read {ref} there instead",
            )
    return list(notes.values())


def check_names(names: Sequence[str]) -> str | None:
    """Why ``names`` cannot share one script (two names, one variable), or ``None``."""
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(variable(name), name)
        if other != name:
            return (
                f"placeholders {{{other}}} and {{{name}}} would both be passed as the shell "
                f"variable {variable(name)}; rename one of the space's vars"
            )
    return None


def script(
    parts: Sequence[tuple[str, str | None]], placements: Sequence[Placement]
) -> tuple[str, list[str]]:
    """The template (``parts``: literal, name) with each placeholder replaced by its reference,
    and the distinct names in positional order."""
    out: list[str] = []
    places = iter(placements)
    for literal, name in parts:
        out.append(literal)
        if name is not None:
            place = next(places)
            out.append(reference(place.name, place.where))
    order = list(dict.fromkeys(place.name for place in placements))
    return "".join(out), order


def argv(
    body: str, order: Sequence[str], values: Mapping[str, str], shell: str = SHELL
) -> list[str]:
    """``shell -c 'prelude; body' shell v1 v2 ...``: the values as positional parameters
    (``$0`` stays the shell's path, as in its messages without placeholders)."""
    if not order:
        return [shell, "-c", body]
    assign = " ".join(f"{variable(name)}=${{{k}}}" for k, name in enumerate(order, start=1))
    exported = " ".join(variable(name) for name in order)
    prelude = f"{assign}; export {exported}; shift {len(order)}; "
    return [shell, "-c", prelude + body, shell, *(values[name] for name in order)]

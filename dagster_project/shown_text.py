"""Text from data or a server, made safe to show: in a terminal, a log line or the operator's page.

A file name, a conversation id, an answer's excerpt, a model's name or a server's error holds whatever its source
wrote: ESC sequences that clear the screen or make hyperlinks (OSC 8), bidirectional overrides that reorder what is
read, line breaks that forge a line of our own, HTML the page would render. `shown` writes every character that
is not printable as its Python escape (`\\x1b`, `\\u202e`, `\\n`) and leaves the rest as is; the outputs apply it
to the data they print (`shown`), or to the whole text they composed around it (`shown_lines`, `shown_markdown`).
"""

from __future__ import annotations

_HTML = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def shown(value: object) -> str:
    """`value` as text with every non-printable character escaped (line breaks too: one value, one line)."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in text)


def shown_lines(text: str) -> str:
    """Text composed around data, line by line: its own line breaks kept, every other non-printable escaped."""
    return "\n".join(shown(line) for line in text.split("\n"))


def shown_markdown(text: str) -> str:
    """Text for the page, which Dagster renders as Markdown: `shown_lines`, and HTML's characters as entities (a
    tag in the data is shown, never rendered)."""
    return shown_lines(text).translate(_HTML)

"""Text the commands did not write themselves (keys, node ids, hosts, tenants, a story's
details, the master's messages), made safe to show on a terminal.

Such text is data, never formatting: Rich would read ``[...]`` in it as markup (a key
``x[/]`` fails the whole table, ``[link=...]`` hides what follows) and ``:name:`` as an
emoji, and a control character reaches the terminal as it is (an escape sequence retitles
the window or moves the cursor; a newline fakes a row). So cells are Rich ``Text`` (no markup,
no emoji), and text with a character that is not printable (controls, bidi overrides,
zero-width characters) is shown as its Python repr, escapes spelled out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text


def printable(text: object) -> str:
    """``text`` as it is when every character of it is printable, else its repr."""
    value = text if isinstance(text, str) else str(text)
    return value if value.isprintable() else repr(value)


def cell(text: object) -> Text:
    """``printable(text)`` as a Rich table cell or line: shown as it is, never as markup."""
    from rich.text import Text

    return Text(printable(text))


def line(text: str) -> Text:
    """A line the command composed (with ``printable`` parts), for ``Console.print``:
    shown as it is, never as markup."""
    from rich.text import Text

    return Text(text)


def message(text: object) -> str:
    """A message (an error's, which may quote what a peer sent) for a plain ``print``: each
    character that is not printable but a newline spelled out as its escape."""
    value = text if isinstance(text, str) else str(text)
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() or c == "\n" else repr(c)[1:-1] for c in value)

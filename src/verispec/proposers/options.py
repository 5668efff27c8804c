"""The text of a proposer spec's options, read into values: one place for the integer an
option names and the message when it names none."""

from __future__ import annotations


def integer(text: str, message: str) -> int:
    """`text` as an integer, or ValueError("<message>, got '<text>'").

    >>> integer("8", "layerskip:L needs an integer number of layers L")
    8
    """
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{message}, got {text!r}") from None

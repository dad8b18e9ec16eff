"""Text cleaning as in the reference experiment: HTML out, entities decoded, whitespace normalised.

Case and punctuation are kept: GPT-2's byte-level BPE models them, and lower-casing would throw away
information the model is meant to learn.
"""

from __future__ import annotations

import html
import re

# Part of the cache key: bump when the output of `clean_text` changes for any input.
CLEANING_VERSION = 1

# Script and style bodies are code, not prose; drop them with their tags.
_SCRIPT_STYLE = re.compile(r"<(script|style)\b[^>]*>.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
# Tags that end a line or paragraph in the rendered page become a newline, so "a<br>b" does not
# fuse into "ab"; the paragraph rules below then tidy up the newlines.
_BLOCK_TAG = re.compile(r"</?(?:p|br|div|li|ul|ol|h[1-6]|tr|table|blockquote|section|article)\b[^<>]*>", re.IGNORECASE)
# Any other tag: a "<" followed by a letter or "/" letter, up to the next ">". Requiring the letter
# leaves prose such as "3 < 5 and 7 > 2" intact.
_TAG = re.compile(r"</?[A-Za-z][^<>]*>")
# Runs of horizontal whitespace (including the no-break and thin spaces that &nbsp; and friends decode
# to), which become one space. A lone " " is already that, so it is not matched: replacing every space
# between two words with itself was a third of the cleaning time.
_SPACES = re.compile(r"[^\S\n]{2,}|[^\S\n ]")
# A space before or after a line break, which is dropped (a bare "\n" is left alone, for the same reason).
_SPACE_AROUND_NEWLINE = re.compile(r" \n ?|\n ")
_BLANK_LINES = re.compile(r"\n{3,}")


def clean_text(text: str) -> str:
    """Strip HTML tags, decode HTML entities and normalise whitespace; "" means an empty document.

    Whitespace choice: runs of spaces and tabs become one space; line breaks are kept, and any run of
    blank lines becomes exactly one blank line ("\\n\\n"), which is how paragraphs are separated. GPT-2
    was trained on text with its newlines, "\\n\\n" is a single token in its vocabulary, and paragraph
    structure is cheap signal, so flattening everything to spaces would lose information while more
    than one blank line carries none. Leading and trailing whitespace is removed.
    """
    text = _SCRIPT_STYLE.sub("", text)
    text = _COMMENT.sub("", text)
    text = _BLOCK_TAG.sub("\n", text)
    text = _TAG.sub("", text)
    # Decode after stripping, so an escaped "&lt;b&gt;" stays visible text instead of becoming a tag.
    text = html.unescape(text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _SPACES.sub(" ", text)
    text = _SPACE_AROUND_NEWLINE.sub("\n", text)
    text = _BLANK_LINES.sub("\n\n", text)
    return text.strip()


def is_empty(text: str | None) -> bool:
    """A document with no visible characters, which the pipeline drops."""
    return text is None or not text.strip()

"""How gradlint reads a source file's bytes: its encoding, its line breaks, and what LibCST must not be given.

The engine decides from these, before any parse, whether a file can be linted at all;
the fixer and `--add-noqa` write files back in the encoding they were read with.
"""

from __future__ import annotations

import io
import re
import tokenize

# Line breaks as LibCST counts lines: the line numbers of diagnostics and edits.
LINE_BREAK = re.compile(r"\r\n|\r|\n")
# PEP 263's cookie, in one of the first two lines (group 1: what precedes it, for its line).
_COOKIE = re.compile(rb"\A((?:[^\n]*\n)?)[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")

# Deeper bracket nesting takes LibCST seconds (CPython itself refuses more than 200 levels).
MAX_NESTING = 100
MAX_FILE_BYTES = 2 << 20
# What hides brackets from the nesting count: comments and string literals. Scanned as UTF-8
# bytes; a string's prefix (`f`, `rb`, ...) is read back from the bytes before its quote.
_STRINGISH = re.compile(rb"#[^\r\n]*|'{3}|\"{3}|'|\"")
_PREFIX = re.compile(rb"(?<![\w.])(?i:rb|br|fr|rf|tr|rt|r|u|b|f|t)\Z")
# The rest of a string literal that is not an f-string, from after its opening quote.
_PLAIN_END = {
    b"'''": re.compile(rb"(?:[^\\]|\\.)*?'{3}", re.DOTALL),
    b'"""': re.compile(rb"(?:[^\\]|\\.)*?\"{3}", re.DOTALL),
    b"'": re.compile(rb"(?:[^'\\\r\n]|\\.)*'?"),
    b'"': re.compile(rb"(?:[^\"\\\r\n]|\\.)*\"?"),
}
# What matters in an f-string's literal text: escapes, `{{`, `{`, its closing quote, and the
# line end that leaves a one-line f-string unterminated.
_FSTRING_STOP = {
    quote: re.compile(rb"\\.|\{\{|\{|" + re.escape(quote) + (rb"|[\r\n]" if len(quote) == 1 else b""), re.DOTALL)
    for quote in _PLAIN_END
}
_OPENING = frozenset(b"([{")
_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"()[]{}")


def unparsable(data: bytes, text: str) -> str | None:
    """Why LibCST must not be given `data`, decoded as `text`.

    It needs about 1 GB of memory per MB of source, and its time and memory grow
    quadratically with bracket nesting (it crashes beyond about 2,000 levels).
    """
    if len(data) > MAX_FILE_BYTES:
        size, limit = len(data) / 2**20, MAX_FILE_BYTES >> 20
        return f"cannot lint: the file is {size:.1f} MB, over gradlint's limit of {limit} MB"
    if _bracket_depth(data, text) > MAX_NESTING:
        return f"cannot parse: brackets are nested more than {MAX_NESTING} deep"
    return None


def _bracket_depth(data: bytes, text: str) -> int:
    """The deepest bracket nesting of the code in `text`: brackets in strings and comments do not count.

    A count of the bytes settles a file with too few opening brackets to reach the limit.
    Otherwise a scan skips comments and string literals (a `)` in a string must not hide
    real nesting), and counts the brackets of the code in f-string replacement fields,
    which LibCST parses too, with quotes nested as Python 3.12 allows. `tokenize` would do,
    but before 3.12 it is pure Python (a sixth of the parse) and rejects 3.12's f-strings.
    """
    if data.count(b"(") + data.count(b"[") + data.count(b"{") <= MAX_NESTING:
        return 0
    return _scan_code(text.encode("utf-8", "surrogatepass"), 0, 0, in_field=False)[1]


def _scan_code(code: bytes, position: int, depth: int, *, in_field: bool) -> tuple[int, int]:
    """Scan code from `position`, at bracket `depth`, to the end or (`in_field`) past the `}` closing the field.

    Returns where the scan stopped and the deepest nesting it saw.
    """
    level = deepest = depth
    while True:
        match = _STRINGISH.search(code, position)
        end = match.start() if match is not None else len(code)
        if in_field:  # rare and short: byte by byte, to find the `}` that ends the field
            for offset, byte in enumerate(code[position:end]):
                if byte in b")]}" and level == depth:
                    return position + offset + 1, deepest
                level = level + 1 if byte in _OPENING else level - 1 if byte in b")]}" else level
                deepest = max(deepest, level)
        else:
            for byte in code[position:end].translate(None, _NOT_BRACKETS):
                level = level + 1 if byte in _OPENING else max(level - 1, 0)
                deepest = max(deepest, level)
        if match is None:
            return len(code), deepest
        position = match.end()
        quote = match[0]
        if quote.startswith(b"#"):
            continue  # a comment
        prefix = _PREFIX.search(code, max(end - 2, 0), end)
        if prefix is not None and (b"f" in prefix[0].lower() or b"t" in prefix[0].lower()):
            position, inner = _scan_fstring(code, position, quote, level)
            deepest = max(deepest, inner)
        else:
            rest = _PLAIN_END[quote].match(code, position)
            position = rest.end() if rest is not None else len(code)


def _scan_fstring(code: bytes, position: int, quote: bytes, depth: int) -> tuple[int, int]:
    """Skip an f-string's literal text from `position`, scanning its replacement fields as code."""
    deepest = depth
    while (stop := _FSTRING_STOP[quote].search(code, position)) is not None:
        position = stop.end()
        if stop[0] == quote:
            return position, deepest
        if stop[0] in (b"\r", b"\n"):
            return stop.start(), deepest  # unterminated: the parser reports it
        if stop[0] == b"{":
            position, inner = _scan_code(code, position, depth + 1, in_field=True)
            deepest = max(deepest, inner)
    return len(code), deepest


def undecodable(data: bytes) -> str | None:
    """Why the bytes `data` cannot be decoded as a source file, or None."""
    try:
        decode_source(data)
    except (SyntaxError, UnicodeDecodeError, LookupError) as error:
        return f"cannot decode: {error}"
    return None


def source_encoding(data: bytes) -> str:
    """The codec that reads the source file `data`: its BOM or PEP 263 cookie, as CPython reads it.

    A cookie naming a codec that is not installed here (old research code declares
    `# -*- coding: future_fstrings -*-`, a codec a package registers) reads as UTF-8
    when the bytes are UTF-8; otherwise this raises SyntaxError, as CPython does.
    """
    try:
        return tokenize.detect_encoding(io.BytesIO(data).readline)[0]
    except SyntaxError as error:
        if not str(error).startswith("unknown encoding") or not _is_utf8(data):
            raise
        return "utf-8"


def unknown_codec(data: bytes) -> tuple[int, str] | None:
    """(line, message) for a cookie naming a codec not installed here, on a file `source_encoding` reads as UTF-8
    anyway; None otherwise.

    Python itself refuses such a file unless a package registers the codec, so it is
    reported, and its findings as UTF-8 still come with it: nothing is lost either way.
    """
    cookie = _COOKIE.search(b"\n".join(data[:4096].splitlines()[:2]))  # PEP 263: the first two lines
    if cookie is None or not _is_utf8(data):
        return None  # no cookie, or bytes the decoding reports
    try:
        tokenize.detect_encoding(io.BytesIO(data).readline)
        return None  # Python reads it: the codec is installed, or the line is no cookie (code comes before it)
    except SyntaxError:
        codec = cookie[2].decode("ascii")
        message = f"unknown encoding: {codec}; Python cannot read this file unless a package registers it"
        return 1 + cookie[1].count(b"\n"), f"{message} (linted as UTF-8)"


def decode_source(data: bytes) -> str:
    """The text of the source file `data`, read with `source_encoding`; raises as `bytes.decode` does."""
    return data.decode(source_encoding(data))


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True

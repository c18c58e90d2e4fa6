"""A small HOCON subset parser, enough for DataStax driver files like stacksaga-cassandra.conf.

Supported (Lightbend HOCON spec section numbers in brackets):

* objects with or without root braces, ``=`` or ``:`` separators, ``key { ... }`` [Syntax];
* dotted path keys ``a.b.c = 1`` expanding to nested objects, quoted keys ``"a.b" = 1``;
* duplicate keys: two objects merge, otherwise the later value wins [Duplicate keys];
* arrays, commas or newlines as separators, one trailing comma;
* quoted strings with JSON escapes; unquoted strings; ``true``/``false``/``null``; numbers;
* value concatenation of simple values on one line (``1 second`` -> ``"1 second"``);
* ``#`` and ``//`` comments;
* substitutions [Substitutions]: ``${a.b}`` takes the value at that path of this file, else
  the environment variable of that name (``${CASSANDRA_PASSWORD}``); ``${?NAME}`` is
  optional: when neither exists the field is left as it was before (unset, or its earlier
  value), an array element is dropped, and in a concatenation it is empty. A required one
  that is missing, a cycle, or an object or array inside a string concatenation is an error
  naming the substitution. Values from the environment are strings, as the spec says.

Not supported, rejected with an error naming the line: ``include``, ``+=``, triple-quoted
strings, self-referential substitutions (``a = ${a}...``) and substitutions in keys. The
missing features exist to compose files, which a single service file does not do.

The result is plain ``dict``/``list``/``str``/``int``/``float``/``bool``/``None``; typing and
defaults are the caller's business (:mod:`stacksaga_store.config.driver`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any

from stacksaga_store.errors import ConfigError

__all__ = ["HoconError", "parse_hocon"]

# Characters HOCON forbids in unquoted text (spec "Unquoted strings"), plus whitespace.
_FORBIDDEN_UNQUOTED = set('$"{}[]:=,+#`^?!@*&\\')
# A config file is small; anything deeper than this is a mistake or an attack on the parser.
NESTING_DEPTH_MAX = 64
TEXT_LENGTH_MAX = 1_000_000


class HoconError(ConfigError):
    """A syntax error or an unsupported HOCON feature, with file, line and column."""

    def __init__(self, origin: str, line: int, column: int, message: str) -> None:
        super().__init__([(f"{origin}:{line}:{column}", message)])
        self.line = line
        self.column = column


class _Kind(Enum):
    LBRACE = auto()
    RBRACE = auto()
    LBRACKET = auto()
    RBRACKET = auto()
    SEPARATOR = auto()  # '=' or ':'
    COMMA = auto()
    NEWLINE = auto()
    SPACE = auto()
    QUOTED = auto()
    UNQUOTED = auto()
    SUBSTITUTION = auto()  # ${path} or ${?path}; text is the path
    EOF = auto()


@dataclass(frozen=True, slots=True)
class _Token:
    kind: _Kind
    text: str
    line: int
    column: int
    optional: bool = False


@dataclass(frozen=True, slots=True)
class _Reference:
    """One ``${path}`` / ``${?path}``, resolved after the whole file is parsed."""

    path: tuple[str, ...]
    optional: bool
    line: int
    column: int

    @property
    def spelled(self) -> str:
        return "${" + ("?" if self.optional else "") + ".".join(self.path) + "}"


@dataclass(slots=True)
class _Pending:
    """A value that holds substitutions: ``parts`` concatenated once they are resolved.

    ``previous`` is what the field held before this assignment, kept for an optional
    substitution that turns out to be undefined (the spec leaves the field as it was).
    """

    parts: list[str | _Reference]
    previous: Any = field(default=None)
    has_previous: bool = False


_PUNCTUATION = {
    "{": _Kind.LBRACE,
    "}": _Kind.RBRACE,
    "[": _Kind.LBRACKET,
    "]": _Kind.RBRACKET,
    "=": _Kind.SEPARATOR,
    ":": _Kind.SEPARATOR,
    ",": _Kind.COMMA,
}


class _Lexer:
    def __init__(self, text: str, origin: str) -> None:
        self.text = text
        self.origin = origin
        self.position = 0
        self.line = 1
        self.line_start = 0

    def error(self, message: str, line: int | None = None, column: int | None = None) -> HoconError:
        column = column if column is not None else self.position - self.line_start + 1
        return HoconError(self.origin, line or self.line, column, message)

    def tokens(self) -> list[_Token]:
        result: list[_Token] = []
        while True:
            token = self._next()
            result.append(token)
            if token.kind is _Kind.EOF:
                return result

    def _next(self) -> _Token:
        text, start = self.text, self.position
        line, column = self.line, start - self.line_start + 1
        if start >= len(text):
            return _Token(_Kind.EOF, "", line, column)
        char = text[start]
        if char == "\n":
            self.position += 1
            self.line += 1
            self.line_start = self.position
            return _Token(_Kind.NEWLINE, "\n", line, column)
        if char == "#" or text.startswith("//", start):
            end = text.find("\n", start)
            self.position = len(text) if end < 0 else end
            return self._next()
        if char in " \t\r\ufeff":
            while self.position < len(text) and text[self.position] in " \t\r\ufeff":
                self.position += 1
            return _Token(_Kind.SPACE, text[start : self.position], line, column)
        if char == "+" and text.startswith("+=", start):
            raise self.error("'+=' is not supported by this HOCON subset")
        if char in _PUNCTUATION:
            self.position += 1
            return _Token(_PUNCTUATION[char], char, line, column)
        if char == '"':
            return self._quoted(line, column)
        if char == "$" and text.startswith("${", start):
            return self._substitution(line, column)
        return self._unquoted(line, column)

    def _substitution(self, line: int, column: int) -> _Token:
        text, start = self.text, self.position + 2
        optional = text.startswith("?", start)
        if optional:
            start += 1
        end = text.find("}", start)
        newline = text.find("\n", start)
        if end < 0 or 0 <= newline < end:
            raise self.error("unterminated substitution: '${' without '}' on its line")
        path = text[start:end].strip()
        segments = path.split(".")
        if not path or any(
            not segment or any(c in _FORBIDDEN_UNQUOTED or c.isspace() for c in segment)
            for segment in segments
        ):
            raise self.error(
                f"bad substitution ${{{text[self.position + 2 : end]}}}: expected a dotted path"
                " of unquoted names"
            )
        self.position = end + 1
        return _Token(_Kind.SUBSTITUTION, path, line, column, optional)

    def _quoted(self, line: int, column: int) -> _Token:
        text, start = self.text, self.position
        if text.startswith('"""', start):
            raise self.error("triple-quoted strings are not supported by this HOCON subset")
        index = start + 1
        while index < len(text):
            char = text[index]
            if char == "\\":
                index += 2
                continue
            if char == "\n":
                break
            if char == '"':
                raw = text[start : index + 1]
                self.position = index + 1
                try:
                    value = json.loads(raw)
                except ValueError as exc:
                    raise self.error(
                        f"bad escape in quoted string {raw}: {exc}", line, column
                    ) from None
                return _Token(_Kind.QUOTED, str(value), line, column)
            index += 1
        raise self.error("unterminated quoted string", line, column)

    def _unquoted(self, line: int, column: int) -> _Token:
        text, start = self.text, self.position
        index = start
        while index < len(text):
            char = text[index]
            if char in _FORBIDDEN_UNQUOTED or char.isspace() or text.startswith("//", index):
                break
            index += 1
        if index == start:
            raise self.error(
                f'unexpected {text[start]!r}; quote values that contain it (e.g. "host:9042")'
            )
        self.position = index
        return _Token(_Kind.UNQUOTED, text[start:index], line, column)


class _Parser:
    def __init__(self, tokens: list[_Token], lexer: _Lexer) -> None:
        self.tokens = tokens
        self.index = 0
        self.lexer = lexer
        self.depth = 0

    # -- helpers ----------------------------------------------------------------------------

    def peek(self) -> _Token:
        return self.tokens[self.index]

    def take(self) -> _Token:
        token = self.tokens[self.index]
        if token.kind is not _Kind.EOF:
            self.index += 1
        return token

    def skip(self, *kinds: _Kind) -> None:
        while self.peek().kind in kinds:
            self.take()

    def error(self, token: _Token, message: str) -> HoconError:
        return self.lexer.error(message, token.line, token.column)

    def enter(self, token: _Token) -> None:
        self.depth += 1
        if self.depth > NESTING_DEPTH_MAX:
            raise self.error(token, f"nesting deeper than {NESTING_DEPTH_MAX} levels")

    # -- grammar ----------------------------------------------------------------------------

    def root(self) -> dict[str, Any]:
        self.skip(_Kind.SPACE, _Kind.NEWLINE)
        if self.peek().kind is _Kind.LBRACE:
            value = self.braced_object()
            self.skip(_Kind.SPACE, _Kind.NEWLINE)
            if self.peek().kind is not _Kind.EOF:
                raise self.error(self.peek(), "text after the root object's closing '}'")
            return value
        return self.object_body(_Kind.EOF)

    def braced_object(self) -> dict[str, Any]:
        opening = self.take()
        self.enter(opening)
        value = self.object_body(_Kind.RBRACE)
        closing = self.take()
        if closing.kind is not _Kind.RBRACE:
            raise self.error(opening, "this '{' is never closed")
        self.depth -= 1
        return value

    def object_body(self, end: _Kind) -> dict[str, Any]:
        result: dict[str, Any] = {}
        while True:
            self.skip(_Kind.SPACE, _Kind.NEWLINE)
            token = self.peek()
            if token.kind is end or token.kind is _Kind.EOF:
                return result
            path, key_token = self.key()
            self.skip(_Kind.SPACE)
            after = self.peek()
            if after.kind is _Kind.SEPARATOR:
                self.take()
                self.skip(_Kind.SPACE, _Kind.NEWLINE)
                value = self.value()
            elif after.kind is _Kind.LBRACE:
                value = self.braced_object()
            else:
                raise self.error(after, f"expected '=', ':' or '{{' after key {'.'.join(path)!r}")
            _assign(result, path, value)
            self.end_of_entry(end, key_token)

    def end_of_entry(self, end: _Kind, key_token: _Token) -> None:
        self.skip(_Kind.SPACE)
        token = self.peek()
        if token.kind is _Kind.COMMA:
            self.take()
        elif token.kind is _Kind.SEPARATOR:
            raise self.error(token, f"unexpected {token.text!r}; quote values that contain it")
        elif token.kind not in (_Kind.NEWLINE, end, _Kind.EOF):
            raise self.error(token, f"unexpected {token.text!r}; put one entry per line")
        if token.kind is _Kind.EOF and end is not _Kind.EOF:
            raise self.error(key_token, "missing '}' before the end of the file")

    def key(self) -> tuple[list[str], _Token]:
        first = self.peek()
        if first.kind is _Kind.UNQUOTED and first.text == "include":
            raise self.error(first, "include is not supported by this HOCON subset")
        if first.kind is _Kind.SUBSTITUTION:
            raise self.error(first, "substitutions in keys are not supported")
        segments: list[str] = [""]
        saw_text = False
        while self.peek().kind in (_Kind.UNQUOTED, _Kind.QUOTED, _Kind.SPACE):
            token = self.take()
            if token.kind is _Kind.QUOTED:
                segments[-1] += token.text
                saw_text = True
            elif token.kind is _Kind.SPACE:
                if self.peek().kind in (_Kind.UNQUOTED, _Kind.QUOTED):
                    segments[-1] += token.text
            else:
                pieces = token.text.split(".")
                segments[-1] += pieces[0]
                segments.extend(pieces[1:])
                saw_text = True
        if not saw_text or any(segment == "" for segment in segments):
            raise self.error(first, f"expected a key, found {first.text!r}")
        return segments, first

    def value(self) -> Any:
        token = self.peek()
        if token.kind is _Kind.LBRACE:
            return self.braced_object()
        if token.kind is _Kind.LBRACKET:
            return self.array()
        if token.kind in (_Kind.QUOTED, _Kind.UNQUOTED, _Kind.SUBSTITUTION):
            return self.simple_value()
        raise self.error(token, f"expected a value, found {token.text.strip() or token.kind.name}")

    def simple_value(self) -> Any:
        parts: list[_Token] = []
        kinds = (_Kind.QUOTED, _Kind.UNQUOTED, _Kind.SPACE, _Kind.SUBSTITUTION)
        while self.peek().kind in kinds:
            parts.append(self.take())
        while parts and parts[-1].kind is _Kind.SPACE:
            parts.pop()
        if len(parts) == 1 and parts[0].kind is _Kind.UNQUOTED:
            return _literal(parts[0].text)
        if any(part.kind is _Kind.SUBSTITUTION for part in parts):
            return _Pending(
                [
                    _Reference(tuple(p.text.split(".")), p.optional, p.line, p.column)
                    if p.kind is _Kind.SUBSTITUTION
                    else p.text
                    for p in parts
                ]
            )
        return "".join(part.text for part in parts)

    def array(self) -> list[Any]:
        opening = self.take()
        self.enter(opening)
        items: list[Any] = []
        while True:
            self.skip(_Kind.SPACE, _Kind.NEWLINE)
            token = self.peek()
            if token.kind is _Kind.RBRACKET:
                self.take()
                self.depth -= 1
                return items
            if token.kind is _Kind.EOF:
                raise self.error(opening, "this '[' is never closed")
            items.append(self.value())
            self.skip(_Kind.SPACE)
            separator = self.peek()
            if separator.kind is _Kind.COMMA:
                self.take()
            elif separator.kind is _Kind.EOF:
                raise self.error(opening, "this '[' is never closed")
            elif separator.kind not in (_Kind.NEWLINE, _Kind.RBRACKET):
                raise self.error(separator, f"unexpected {separator.text!r} inside an array")


def _literal(text: str) -> Any:
    if text == "true":
        return True
    if text == "false":
        return False
    if text == "null":
        return None
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            continue
    return text


def _assign(target: dict[str, Any], path: list[str], value: Any) -> None:
    for segment in path[:-1]:
        existing = target.get(segment)
        if not isinstance(existing, dict):
            existing = {}
            target[segment] = existing
        target = existing
    last = path[-1]
    if isinstance(value, dict) and isinstance(target.get(last), dict):
        _merge(target[last], value)
    else:
        if isinstance(value, _Pending) and last in target:
            value.previous, value.has_previous = target[last], True
        target[last] = value


def _merge(target: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


_UNDEFINED = object()


class _Resolver:
    """Replaces every :class:`_Pending` in the parsed tree by its value (spec: substitutions
    are resolved against the whole merged file, then the environment)."""

    def __init__(self, root: dict[str, Any], env: Mapping[str, str], origin: str) -> None:
        self.root = root
        self.env = env
        self.origin = origin
        self.resolving: list[tuple[str, ...]] = []

    def error(self, reference: _Reference, message: str) -> HoconError:
        return HoconError(self.origin, reference.line, reference.column, message)

    def tree(self, node: dict[str, Any], path: tuple[str, ...]) -> None:
        for key in list(node):
            if key not in node:
                continue
            value = self.value(node[key], (*path, key))
            if value is _UNDEFINED:
                del node[key]
            else:
                node[key] = value

    def value(self, value: Any, path: tuple[str, ...]) -> Any:
        if isinstance(value, dict):
            self.tree(value, path)
            return value
        if isinstance(value, list):
            items = [self.value(item, (*path, str(i))) for i, item in enumerate(value)]
            return [item for item in items if item is not _UNDEFINED]
        if isinstance(value, _Pending):
            return self.pending(value, path)
        return value

    def pending(self, pending: _Pending, path: tuple[str, ...]) -> Any:
        references = [part for part in pending.parts if isinstance(part, _Reference)]
        if path in self.resolving:
            raise self.error(references[0], f"{references[0].spelled} is part of a cycle")
        self.resolving.append(path)
        try:
            resolved = [
                self.lookup(part, path) if isinstance(part, _Reference) else part
                for part in pending.parts
            ]
        finally:
            self.resolving.pop()
        if len(resolved) == 1:
            if resolved[0] is not _UNDEFINED:
                return resolved[0]
            if pending.has_previous:
                return self.value(pending.previous, path)
            return _UNDEFINED
        text: list[str] = []
        for part, original in zip(resolved, pending.parts, strict=True):
            if part is _UNDEFINED:
                continue
            if isinstance(part, dict | list):
                spelled = original.spelled if isinstance(original, _Reference) else "?"
                raise self.error(
                    references[0],
                    f"{spelled} is an object or array and cannot be joined into a string",
                )
            text.append(_as_text(part))
        return "".join(text)

    def lookup(self, reference: _Reference, within: tuple[str, ...]) -> Any:
        if reference.path == within[: len(reference.path)]:
            raise self.error(
                reference, f"{reference.spelled} refers to itself, which is not supported"
            )
        node: Any = self.root
        for index, segment in enumerate(reference.path):
            if not isinstance(node, dict) or segment not in node:
                node = _UNDEFINED
                break
            child = node[segment]
            if isinstance(child, _Pending):
                child = self.pending(child, reference.path[: index + 1])
                if child is _UNDEFINED:
                    del node[segment]
                else:
                    node[segment] = child
            node = child
        if node is not _UNDEFINED:
            return self.value(node, reference.path)
        name = ".".join(reference.path)
        if name in self.env:
            return self.env[name]
        if reference.optional:
            return _UNDEFINED
        raise self.error(
            reference,
            f"{reference.spelled} is not set: no {name!r} in this file and no environment "
            f"variable {name} (write ${{?{name}}} to leave the property out when it is unset)",
        )


def _as_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_hocon(
    text: str, origin: str = "<hocon>", env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Parse HOCON text into nested dicts; ``origin`` names the file in error messages.

    Substitutions that name no path of the file read ``env`` (default: ``os.environ``).
    """
    if len(text) > TEXT_LENGTH_MAX:
        raise HoconError(origin, 1, 1, f"longer than {TEXT_LENGTH_MAX} characters")
    lexer = _Lexer(text, origin)
    root = _Parser(lexer.tokens(), lexer).root()
    _Resolver(root, os.environ if env is None else env, origin).tree(root, ())
    return root

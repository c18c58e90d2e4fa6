"""Text to :mod:`accord_cassandra.cql.ast`: lark does the scanning and parsing (the grammar is
in :mod:`accord_cassandra.cql.grammar`); this module turns its tree into the AST and its
errors into :class:`CqlSyntaxError` with the line, column and expected tokens."""

from __future__ import annotations

import functools
import math
import uuid
from typing import cast

import lark
from lark import Token, Tree

from accord_cassandra.cql import ast
from accord_cassandra.cql.grammar import DISPLAY, GRAMMAR
from accord_cassandra.errors import AccordCassandraError

# Longer texts are refused before parsing: a client API request is at most 1 MiB, and the
# text of one is no longer than that.
MAX_TEXT_CHARS = 1024 * 1024


class CqlError(AccordCassandraError, ValueError):
    """A transaction text that cannot become a client API transaction: the message names the
    construct (and where it is, when it has a place in the text)."""


class CqlSyntaxError(CqlError):
    """Not in the grammar: ``line``/``column`` (1-based) of the offending token, the token as
    written (``None`` at end of input) and the tokens that could have been there."""

    def __init__(
        self, message: str, line: int, column: int, token: str | None, expected: list[str]
    ) -> None:
        super().__init__(message)
        self.line = line
        self.column = column
        self.token = token
        self.expected = expected


@functools.cache
def _parser() -> lark.Lark:
    return lark.Lark(
        GRAMMAR,
        start="transaction",
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=False,
    )


def _shown(names: set[str] | frozenset[str]) -> list[str]:
    return sorted({DISPLAY.get(name, f"'{name}'") for name in names})


def _near(text: str, line: int, column: int) -> str:
    lines = text.splitlines() or [""]
    source = lines[line - 1] if 0 < line <= len(lines) else ""
    start = max(0, column - 1 - 30)
    return f"{source[start : column - 1].lstrip()}[{source[column - 1 : column + 29]}]"


def parse(text: str) -> ast.Transaction:
    """The AST of one transaction; :class:`CqlSyntaxError` if it is not one. The same text
    is parsed once (the AST is immutable): clients send the same text with new values."""
    return _parse(text)


@functools.lru_cache(maxsize=256)
def _parse(text: str) -> ast.Transaction:
    if len(text) > MAX_TEXT_CHARS:
        raise CqlError(f"the transaction text has {len(text)} characters; at most {MAX_TEXT_CHARS}")
    try:
        tree = _parser().parse(text)
    except lark.UnexpectedToken as error:
        expected = _shown(error.accepts or error.expected)
        token = cast("Token", error.token)
        if token.type == "$END":
            line, column = _end(text)
            message = f"line {line}:{column} unexpected end of input, expecting {_or(expected)}"
            raise CqlSyntaxError(message, line, column, None, expected) from None
        line, column = error.line, error.column
        message = (
            f"line {line}:{column} mismatched input '{token}' expecting {_or(expected)} "
            f"({_near(text, line, column)})"
        )
        raise CqlSyntaxError(message, line, column, str(token), expected) from None
    except lark.UnexpectedCharacters as error:
        expected = _shown(error.allowed or set())
        line, column = error.line, error.column
        at = error.pos_in_stream or 0
        char = text[at] if at < len(text) else ""
        message = (
            f"line {line}:{column} token recognition error at '{char}', expecting "
            f"{_or(expected)} ({_near(text, line, column)})"
        )
        raise CqlSyntaxError(message, line, column, char, expected) from None
    except lark.UnexpectedEOF as error:  # pragma: no cover - LALR reports UnexpectedToken
        line, column = _end(text)
        expected = _shown(set(error.expected))
        message = f"line {line}:{column} unexpected end of input, expecting {_or(expected)}"
        raise CqlSyntaxError(message, line, column, None, expected) from None
    return _Converter().transaction(tree)


def _end(text: str) -> tuple[int, int]:
    lines = text.split("\n")
    return len(lines), len(lines[-1]) + 1


def _or(expected: list[str]) -> str:
    if len(expected) == 1:
        return expected[0]
    return "one of " + ", ".join(expected)


def _pos(node: Tree[Token] | Token) -> ast.Pos:
    if isinstance(node, Token):
        return ast.Pos(node.line or 0, node.column or 0)
    meta = node.meta
    return ast.Pos(getattr(meta, "line", 0), getattr(meta, "column", 0))


def _trees(node: Tree[Token], data: str | None = None) -> list[Tree[Token]]:
    return [c for c in node.children if isinstance(c, Tree) and (data is None or c.data == data)]


def _tokens(node: Tree[Token], *types: str) -> list[Token]:
    return [c for c in node.children if isinstance(c, Token) and c.type in types]


def _unquote(text: str, quote: str) -> str:
    return text[1:-1].replace(quote * 2, quote)


class _Converter:
    def __init__(self) -> None:
        self.markers: list[ast.Marker] = []

    # -- names ---------------------------------------------------------------------------

    def name(self, node: Tree[Token]) -> str:
        token = cast("Token", node.children[0])
        if node.data == "quoted":
            return _unquote(str(token), '"')
        return str(token).lower()  # unquoted names are case-insensitive, as in Cassandra

    def table(self, node: Tree[Token]) -> ast.Table:
        names = [self.name(n) for n in _trees(node)]
        if len(names) == 1:
            return ast.Table(None, names[0], _pos(node))
        return ast.Table(names[0], names[1], _pos(node))

    # -- statements ----------------------------------------------------------------------

    def transaction(self, tree: Tree[Token]) -> ast.Transaction:
        lets: list[ast.Let] = []
        returning: tuple[ast.Ref, ...] | None = None
        select: ast.Select | None = None
        conditions: tuple[ast.Condition, ...] | None = None
        modifications: list[ast.Modification] = []
        for node in _trees(tree):
            if node.data == "let_stmt":
                lets.append(self.let(node))
            elif node.data == "select_refs":
                returning = self.returning(node)
            elif node.data == "select_plain":
                select = self.select(node)
            elif node.data in ("unconditional", "conditional"):
                if node.data == "conditional":
                    conditions = self.conditions(_trees(node, "conditions")[0])
                modifications = [self.modification(m) for m in _trees(node, "modification")]
        return ast.Transaction(
            tuple(lets), returning, select, conditions, tuple(modifications), tuple(self.markers)
        )

    def let(self, node: Tree[Token]) -> ast.Let:
        trees = _trees(node)
        name = self.name(trees[0])
        return ast.Let(name, self.select(node, skip=1), _pos(node))

    def select(self, node: Tree[Token], skip: int = 0) -> ast.Select:
        selectors, clause = _trees(node)[skip : skip + 2]
        trees = _trees(clause)
        columns: tuple[str, ...] | None = None
        if selectors.data == "select_list":
            names = []
            for selector in _trees(selectors, "selector"):
                parts = [self.name(n) for n in _trees(selector)]
                if len(parts) != 1:
                    raise CqlError(
                        f"{_pos(selector)}: a SELECT … FROM names columns of its table, "
                        f"not {'.'.join(parts)}"
                    )
                names.append(parts[0])
            columns = tuple(names)
        table = self.table(trees[0])
        where: tuple[ast.Relation, ...] = ()
        order: tuple[tuple[str, str], ...] = ()
        limit: ast.Expr | None = None
        for part in trees[1:]:
            if part.data == "where_clause":
                where = self.where(part)
            elif part.data == "order_by":
                order = tuple(
                    (
                        self.name(_trees(o)[0]),
                        "desc" if _tokens(o, "DESC") else "asc",
                    )
                    for o in _trees(part, "ordering")
                )
            elif part.data == "limit":
                limit = self.int_or_marker(part)
        return ast.Select(columns, table, where, order, limit, _pos(node))

    def returning(self, node: Tree[Token]) -> tuple[ast.Ref, ...]:
        selectors = _trees(node)[0]
        if selectors.data == "select_star":
            raise CqlError(
                f"{_pos(node)}: SELECT * needs FROM; to return LET values name them "
                "(SELECT src.balance, dst.balance)"
            )
        refs = []
        for selector in _trees(selectors, "selector"):
            parts = [self.name(n) for n in _trees(selector)]
            if len(parts) != 2:
                raise CqlError(
                    f"{_pos(selector)}: SELECT without FROM returns LET columns; "
                    f"name one as let.column, not {parts[0]}"
                )
            refs.append(ast.Ref(parts[0], parts[1], _pos(selector)))
        return tuple(refs)

    def where(self, node: Tree[Token]) -> tuple[ast.Relation, ...]:
        out = []
        for relation in _trees(node, "relation"):
            name, relop, term = _trees(relation)
            op = str(cast("Token", relop.children[0]))
            out.append(ast.Relation(self.name(name), op, self.expr(term), _pos(relation)))
        return tuple(out)

    def int_or_marker(self, node: Tree[Token]) -> ast.Expr:
        ints = _tokens(node, "INT")
        if ints:
            return ast.Literal(int(ints[0]), _pos(ints[0]))
        return self.expr(_trees(node)[0])

    def using(self, node: Tree[Token], statement: str) -> ast.Expr | None:
        ttl: ast.Expr | None = None
        for item in _trees(node):
            if item.data == "using_timestamp":
                raise CqlError(
                    f"{_pos(item)}: USING TIMESTAMP in {statement}: Accord chooses every "
                    "write's timestamp (from the transaction's executeAt)"
                )
            if statement == "DELETE":
                raise CqlError(f"{_pos(item)}: USING TTL on DELETE (Cassandra refuses it too)")
            if ttl is not None:
                raise CqlError(f"{_pos(item)}: USING TTL given twice")
            ttl = self.int_or_marker(item)
        return ttl

    def refuse_statement_if(self, node: Tree[Token], statement: str) -> None:
        for part in _trees(node):
            if part.data in ("if_exists", "if_conditions", "if_not_exists"):
                raise CqlError(
                    f"{_pos(part)}: a condition on one {statement} inside a transaction: "
                    "write it in the transaction's IF … THEN … END IF (over LET values)"
                )

    def modification(self, node: Tree[Token]) -> ast.Modification:
        statement = _trees(node)[0]
        pos = _pos(statement)
        trees = _trees(statement)
        if statement.data == "insert":
            self.refuse_statement_if(statement, "INSERT")
            table = self.table(trees[0])
            names = [self.name(t) for t in _trees(trees[1])]
            values = [self.expr(t) for t in _trees(trees[2])]
            using = next((t for t in trees if t.data == "using"), None)
            ttl = self.using(using, "INSERT") if using is not None else None
            if len(names) != len(values):
                raise CqlError(
                    f"{pos}: INSERT names {len(names)} column(s) but gives {len(values)} value(s)"
                )
            return ast.Insert(table, tuple(names), tuple(values), ttl, pos)
        if statement.data == "update":
            self.refuse_statement_if(statement, "UPDATE")
            table = self.table(trees[0])
            using = next((t for t in trees if t.data == "using"), None)
            ttl = self.using(using, "UPDATE") if using is not None else None
            assignments = []
            for a in _trees(statement, "assignment"):
                target, value = _trees(a)
                op = str(cast("Token", a.children[1]))
                assignments.append(ast.Assignment(self.name(target), op, self.expr(value), _pos(a)))
            where = self.where(_trees(statement, "where_clause")[0])
            return ast.Update(table, tuple(assignments), where, ttl, pos)
        self.refuse_statement_if(statement, "DELETE")
        names = []
        table_node = _trees(statement, "table_name")[0]
        for t in trees:
            if t is table_node:
                break
            names.append(self.name(t))
        using = next((t for t in trees if t.data == "using"), None)
        if using is not None:
            self.using(using, "DELETE")
        where = self.where(_trees(statement, "where_clause")[0])
        return ast.Delete(self.table(table_node), tuple(names), where, pos)

    # -- conditions and expressions ------------------------------------------------------

    def conditions(self, node: Tree[Token]) -> tuple[ast.Condition, ...]:
        out = []
        for c in _trees(node):
            pos = _pos(c)
            parts = _trees(c)
            if c.data in ("is_null", "not_null"):
                out.append(ast.Condition(c.data, self.expr(parts[0]), None, pos))
            elif c.data in ("exists", "not_exists"):
                name = self.name(parts[0])
                out.append(ast.Condition(c.data, ast.Ref(name, None, pos), None, pos))
            else:
                left, op, right = parts
                out.append(
                    ast.Condition(
                        str(cast("Token", op.children[0])), self.expr(left), self.expr(right), pos
                    )
                )
        return tuple(out)

    def expr(self, node: Tree[Token]) -> ast.Expr:
        pos = _pos(node)
        kind = node.data
        parts = _trees(node)
        if kind in ("add", "sub"):
            return ast.Binary(
                "+" if kind == "add" else "-", self.expr(parts[0]), self.expr(parts[1]), pos
            )
        if kind == "group":
            return self.expr(parts[0])
        if kind == "tuple":
            return ast.Collection("tuple", tuple(self.expr(p) for p in parts), pos)
        if kind == "ref":
            names = [self.name(p) for p in parts]
            return ast.Ref(names[0], names[1] if len(names) > 1 else None, pos)
        if kind == "count":
            return ast.Count(self.name(parts[0]), pos)
        if kind == "positional":
            marker = ast.Marker(len(self.markers), None, pos)
            self.markers.append(marker)
            return marker
        if kind == "named":
            marker = ast.Marker(len(self.markers), self.name(parts[0]), pos)
            self.markers.append(marker)
            return marker
        if kind == "literal":  # a number
            return self.number(parts[0])
        if kind == "string":
            text = str(cast("Token", node.children[0]))
            value = text[2:-2] if text.startswith("$$") else _unquote(text, "'")
            return ast.Literal(value, pos)
        if kind == "uuid":
            return ast.Literal(uuid.UUID(str(node.children[0])), pos)
        if kind == "blob":
            digits = str(node.children[0])[2:]
            if len(digits) % 2:
                raise CqlError(f"{pos}: a blob literal needs an even number of hex digits")
            return ast.Literal(bytes.fromhex(digits), pos)
        if kind in ("true", "false"):
            return ast.Literal(kind == "true", pos)
        if kind == "null":
            return ast.Literal(None, pos)
        if kind == "list":
            return ast.Collection("list", tuple(self.expr(p) for p in parts), pos)
        if kind == "set":
            return ast.Collection("set", tuple(self.expr(p) for p in parts), pos)
        if kind == "empty_braces":
            return ast.Collection("braces", (), pos)
        if kind == "map":
            items: list[ast.Expr] = []
            for entry in parts:
                entry_key, entry_value = _trees(entry)
                items += [self.expr(entry_key), self.expr(entry_value)]
            return ast.Collection("map", tuple(items), pos)
        raise CqlError(f"{pos}: unexpected {kind}")  # pragma: no cover - grammar and code agree

    def number(self, node: Tree[Token]) -> ast.Literal:
        tokens = _tokens(node, "MINUS", "INT", "FLOAT", "NAN", "INFINITY")
        negative = tokens[0].type == "MINUS"
        token = tokens[-1]
        value: int | float
        if token.type == "INT":
            value = int(token)
        elif token.type == "NAN":
            value = math.nan
        elif token.type == "INFINITY":
            value = math.inf
        else:
            value = float(token)
        return ast.Literal(-value if negative else value, _pos(node))

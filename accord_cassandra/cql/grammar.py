"""The grammar of Accord CQL transactions, in lark's EBNF (LALR(1), contextual lexer).

Written for this project after Cassandra's own ``Parser.g``/``Lexer.g`` (``batchTxnStatement``
and the rules it uses): the same statement order (LETs, an optional SELECT, then either
modifications or one ``IF … THEN … END IF`` block, then ``COMMIT TRANSACTION``), the same
literal and identifier lexing (unquoted names fold to lower case, ``"quoted"`` names keep
theirs, keywords are case-insensitive), and the same comments. It parses a little more than
the client API can express (per-statement ``IF``, ``USING TIMESTAMP``, ``IF NOT EXISTS``) so
that those get a semantic error naming them instead of a bare syntax error; see
:mod:`accord_cassandra.cql.build` for every refusal.
"""

GRAMMAR = r"""
transaction: BEGIN TRANSACTION let_stmt* select_stmt? body COMMIT TRANSACTION SEMI?

body: modification*                                    -> unconditional
    | IF conditions THEN modification* END IF          -> conditional

let_stmt: LET name EQ LPAR SELECT selectors from_clause RPAR SEMI

select_stmt: SELECT selectors SEMI                     -> select_refs
           | SELECT selectors from_clause SEMI         -> select_plain
from_clause: FROM table_name (WHERE where_clause)? order_by? limit?

selectors: STAR                                        -> select_star
         | selector (COMMA selector)*                  -> select_list
selector: name (DOT name)?

where_clause: relation (AND relation)*
relation: name relop term
!relop: EQ | LT | LTE | GT | GTE

order_by: ORDER BY ordering (COMMA ordering)*
ordering: name (ASC | DESC)?
limit: LIMIT (INT | marker)

modification: (insert | update | delete) SEMI

insert: INSERT INTO table_name insert_columns VALUES insert_values if_not_exists? using?
insert_columns: LPAR name (COMMA name)* RPAR
insert_values: LPAR expr (COMMA expr)* RPAR
if_not_exists: IF NOT EXISTS
update: UPDATE table_name using? SET assignment (COMMA assignment)* WHERE where_clause statement_if?
!assignment: name (EQ | PLUSEQ | MINUSEQ) expr
delete: DELETE (name (COMMA name)*)? FROM table_name using? WHERE where_clause statement_if?
statement_if: IF EXISTS                                -> if_exists
            | IF conditions                            -> if_conditions

using: USING using_item (AND using_item)*
using_item: TTL (INT | marker)                         -> using_ttl
          | TIMESTAMP (INT | marker)                   -> using_timestamp

conditions: condition (AND condition)*
condition: expr IS NULL                                -> is_null
         | expr IS NOT NULL                            -> not_null
         | expr cmpop expr                             -> compare
         | EXISTS name                                 -> exists
         | NOT EXISTS name                             -> not_exists
!cmpop: EQ | NEQ | LT | LTE | GT | GTE

?expr: operand
     | expr PLUS operand                               -> add
     | expr MINUS operand                              -> sub

?operand: term
        | ref
        | COUNT LPAR name RPAR                         -> count
        | LPAR expr RPAR                               -> group
        | LPAR expr COMMA expr (COMMA expr)* RPAR      -> tuple

ref: name (DOT name)?

?term: literal | marker
marker: QMARK                                          -> positional
      | COLON name                                     -> named

literal: STRING                                        -> string
       | number
       | UUID                                          -> uuid
       | BLOB                                          -> blob
       | TRUE                                          -> true
       | FALSE                                         -> false
       | NULL                                          -> null
       | LSQB (expr (COMMA expr)*)? RSQB               -> list
       | LBRACE RBRACE                                 -> empty_braces
       | LBRACE expr (COMMA expr)* RBRACE              -> set
       | LBRACE entry (COMMA entry)* RBRACE            -> map
entry: expr COLON expr

number: MINUS? (INT | FLOAT | NAN | INFINITY)

table_name: name (DOT name)?
name: IDENT                                            -> ident
    | QUOTED_NAME                                      -> quoted
    | (TTL | TIMESTAMP | KEY | COUNT | VALUES)         -> keyword_ident

// Keywords: case-insensitive, and only whole words ("letter" is a name, not LET + "ter").
BEGIN.2: /BEGIN(?![A-Za-z0-9_])/i
TRANSACTION.2: /TRANSACTION(?![A-Za-z0-9_])/i
COMMIT.2: /COMMIT(?![A-Za-z0-9_])/i
LET.2: /LET(?![A-Za-z0-9_])/i
SELECT.2: /SELECT(?![A-Za-z0-9_])/i
FROM.2: /FROM(?![A-Za-z0-9_])/i
WHERE.2: /WHERE(?![A-Za-z0-9_])/i
AND.2: /AND(?![A-Za-z0-9_])/i
ORDER.2: /ORDER(?![A-Za-z0-9_])/i
BY.2: /BY(?![A-Za-z0-9_])/i
ASC.2: /ASC(?![A-Za-z0-9_])/i
DESC.2: /DESC(?![A-Za-z0-9_])/i
LIMIT.2: /LIMIT(?![A-Za-z0-9_])/i
IF.2: /IF(?![A-Za-z0-9_])/i
THEN.2: /THEN(?![A-Za-z0-9_])/i
END.2: /END(?![A-Za-z0-9_])/i
INSERT.2: /INSERT(?![A-Za-z0-9_])/i
INTO.2: /INTO(?![A-Za-z0-9_])/i
VALUES.2: /VALUES(?![A-Za-z0-9_])/i
UPDATE.2: /UPDATE(?![A-Za-z0-9_])/i
SET.2: /SET(?![A-Za-z0-9_])/i
DELETE.2: /DELETE(?![A-Za-z0-9_])/i
USING.2: /USING(?![A-Za-z0-9_])/i
TTL.2: /TTL(?![A-Za-z0-9_])/i
TIMESTAMP.2: /TIMESTAMP(?![A-Za-z0-9_])/i
IS.2: /IS(?![A-Za-z0-9_])/i
NOT.2: /NOT(?![A-Za-z0-9_])/i
NULL.2: /NULL(?![A-Za-z0-9_])/i
EXISTS.2: /EXISTS(?![A-Za-z0-9_])/i
COUNT.2: /COUNT(?![A-Za-z0-9_])/i
KEY.2: /KEY(?![A-Za-z0-9_])/i
TRUE.2: /TRUE(?![A-Za-z0-9_])/i
FALSE.2: /FALSE(?![A-Za-z0-9_])/i
NAN.2: /NAN(?![A-Za-z0-9_])/i
INFINITY.2: /INFINITY(?![A-Za-z0-9_])/i

SEMI: ";"
COMMA: ","
DOT: "."
COLON: ":"
LPAR: "("
RPAR: ")"
LSQB: "["
RSQB: "]"
LBRACE: "{"
RBRACE: "}"
STAR: "*"
QMARK: "?"
PLUSEQ: "+="
MINUSEQ: "-="
PLUS: "+"
MINUS: "-"
NEQ: "!="
LTE: "<="
GTE: ">="
EQ: "="
LT: "<"
GT: ">"

UUID.4: /[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}(?![0-9a-zA-Z_])/
BLOB.4: /0[xX][0-9a-fA-F]*(?![0-9a-zA-Z_])/
FLOAT.3: /[0-9]+\.[0-9]*([eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+/
INT.2: /[0-9]+(?![0-9a-zA-Z_])/
STRING: /'(?:[^']|'')*'/ | /\$\$(?:.|\n)*?\$\$/
QUOTED_NAME: /"(?:[^"]|"")+"/
IDENT: /[a-zA-Z][a-zA-Z0-9_]*/

LINE_COMMENT: /(--|\/\/)[^\n]*/
BLOCK_COMMENT: /\/\*(?:.|\n)*?\*\//
WS: /[ \t\r\n\f]+/
%ignore LINE_COMMENT
%ignore BLOCK_COMMENT
%ignore WS
"""

# How each terminal is shown in a syntax error's "expecting" list.
DISPLAY = {
    "SEMI": "';'",
    "COMMA": "','",
    "DOT": "'.'",
    "COLON": "':'",
    "LPAR": "'('",
    "RPAR": "')'",
    "LSQB": "'['",
    "RSQB": "']'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "STAR": "'*'",
    "QMARK": "'?'",
    "PLUSEQ": "'+='",
    "MINUSEQ": "'-='",
    "PLUS": "'+'",
    "MINUS": "'-'",
    "NEQ": "'!='",
    "LTE": "'<='",
    "GTE": "'>='",
    "EQ": "'='",
    "LT": "'<'",
    "GT": "'>'",
    "UUID": "a uuid",
    "BLOB": "a blob (0x…)",
    "FLOAT": "a number",
    "INT": "an integer",
    "STRING": "a string",
    "QUOTED_NAME": "a quoted name",
    "IDENT": "a name",
    "$END": "end of input",
}

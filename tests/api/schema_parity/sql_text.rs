//! Just enough of SQL's lexical grammar to read back what the catalogs
//! hold as text: SQLite's `create table` statements (with the comments
//! the migrations wrote in them) and PostgreSQL's deparsed checks and
//! index predicates. Both stores spell one rule differently (`x in ('a',
//! 'b')` and `x = ANY (ARRAY['a'::text, 'b'::text])`, `between 0 and 7`
//! and `(x >= 0) AND (x <= 7)`), so an expression is summarised by what
//! both spellings keep: the columns and the literals it names.

use std::collections::BTreeSet;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Token {
    /// A keyword or an identifier (double-quoted or not), lowercased.
    Word(String),
    /// A string literal's contents.
    Str(String),
    Num(String),
    Sym(char),
}

/// The tokens of `sql`, without comments.
pub fn tokens(sql: &str) -> Vec<Token> {
    let chars: Vec<char> = sql.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c.is_whitespace() {
            i += 1;
        } else if c == '-' && next == Some('-') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                i += 1;
            }
            i += 2;
        } else if c == '\'' || c == '"' {
            let (text, end) = quoted(&chars, i);
            out.push(if c == '\'' { Token::Str(text) } else { Token::Word(text.to_lowercase()) });
            i = end;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            out.push(Token::Num(chars[start..i].iter().collect()));
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '$') {
                i += 1;
            }
            out.push(Token::Word(chars[start..i].iter().collect::<String>().to_lowercase()));
        } else {
            out.push(Token::Sym(c));
            i += 1;
        }
    }
    out
}

/// The contents of the quoted text starting at `start` (a doubled quote
/// stands for one), and the index just past it.
fn quoted(chars: &[char], start: usize) -> (String, usize) {
    let quote = chars[start];
    let mut text = String::new();
    let mut i = start + 1;
    while i < chars.len() {
        if chars[i] == quote {
            if chars.get(i + 1) == Some(&quote) {
                text.push(quote);
                i += 2;
                continue;
            }
            return (text, i + 1);
        }
        text.push(chars[i]);
        i += 1;
    }
    (text, i)
}

/// Each `check (...)` of a statement: the tokens between its parentheses.
pub fn checks(statement: &[Token]) -> Vec<&[Token]> {
    let mut found = Vec::new();
    for (i, t) in statement.iter().enumerate() {
        if *t == Token::Word("check".into()) && statement.get(i + 1) == Some(&Token::Sym('(')) {
            found.push(balanced(&statement[i + 1..]));
        }
    }
    found
}

/// The tokens inside the parenthesis `tokens` starts with.
fn balanced(tokens: &[Token]) -> &[Token] {
    let mut depth = 0;
    for (i, t) in tokens.iter().enumerate() {
        match t {
            Token::Sym('(') => depth += 1,
            Token::Sym(')') => {
                depth -= 1;
                if depth == 0 {
                    return &tokens[1..i];
                }
            }
            _ => {}
        }
    }
    &tokens[1..]
}

/// Whether `expr` is SQLite's spelling of a boolean: `column in (0, 1)`.
pub fn boolean_check(expr: &[Token]) -> Option<&str> {
    match expr {
        [
            Token::Word(column),
            Token::Word(r#in),
            Token::Sym('('),
            Token::Num(a),
            Token::Sym(','),
            Token::Num(b),
            Token::Sym(')'),
        ] if r#in == "in" && ((a == "0" && b == "1") || (a == "1" && b == "0")) => Some(column),
        _ => None,
    }
}

/// What a check or an index predicate says, as far as both stores'
/// spellings of it agree.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    /// The column holds a JSON document (`json_valid(x)`, `x::jsonb is not
    /// null`); `admits_null` when the rule says `x is null or ...` (which
    /// matters to a nullable column only: PostgreSQL's `null::jsonb is not
    /// null` is false).
    Json { admits_null: bool },
    /// Anything else, by the comparisons and the literals it names: `in
    /// ('a', 'b')` and `= ANY (ARRAY['a', 'b'])` agree, so do `between 0
    /// and 7` and `(x >= 0) AND (x <= 7)`; which literal goes with which
    /// comparison is not told apart.
    Values { ops: BTreeSet<&'static str>, literals: BTreeSet<String> },
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rule::Json { admits_null: false } => write!(f, "json"),
            Rule::Json { admits_null: true } => write!(f, "json or null"),
            Rule::Values { ops, literals } => {
                let ops: Vec<&str> = ops.iter().copied().collect();
                let literals: Vec<&str> = literals.iter().map(String::as_str).collect();
                write!(f, "{} [{}]", ops.join(" "), literals.join(", "))
            }
        }
    }
}

/// A check or a predicate: the columns of `columns` it names, and its rule.
pub fn summarise(expr: &[Token], columns: &BTreeSet<String>) -> (BTreeSet<String>, Rule) {
    let named = expr
        .iter()
        .filter_map(|t| match t {
            Token::Word(w) if columns.contains(w) => Some(w.clone()),
            _ => None,
        })
        .collect();
    let word = |i: usize, w: &str| matches!(expr.get(i), Some(Token::Word(x)) if x == w);
    let json = (0..expr.len()).any(|i| {
        word(i, "json_valid")
            || (expr[i] == Token::Sym(':') && expr.get(i + 1) == Some(&Token::Sym(':')) && word(i + 2, "jsonb"))
    });
    if json {
        let admits_null = (0..expr.len()).any(|i| word(i, "is") && word(i + 1, "null"));
        return (named, Rule::Json { admits_null });
    }
    let literals = expr
        .iter()
        .filter_map(|t| match t {
            Token::Str(s) => Some(format!("'{s}'")),
            Token::Num(n) => Some(n.clone()),
            _ => None,
        })
        .collect();
    (named, Rule::Values { ops: comparisons(expr), literals })
}

/// The comparisons `expr` makes, in one spelling for both stores.
fn comparisons(expr: &[Token]) -> BTreeSet<&'static str> {
    let sym = |i: usize, c: char| expr.get(i) == Some(&Token::Sym(c));
    let word = |i: usize, w: &str| matches!(expr.get(i), Some(Token::Word(x)) if x == w);
    let mut ops = BTreeSet::new();
    let mut i = 0;
    while i < expr.len() {
        let (op, len): (&[&'static str], usize) = match &expr[i] {
            Token::Sym('>') if sym(i + 1, '=') => (&[">="], 2),
            Token::Sym('<') if sym(i + 1, '=') => (&["<="], 2),
            Token::Sym('<') if sym(i + 1, '>') && word(i + 2, "all") => (&["not in"], 3),
            Token::Sym('<') if sym(i + 1, '>') => (&["<>"], 2),
            Token::Sym('!') if sym(i + 1, '=') => (&["<>"], 2),
            Token::Sym('=') if word(i + 1, "any") => (&["in"], 2),
            Token::Sym('=') => (&["="], 1),
            Token::Sym('<') => (&["<"], 1),
            Token::Sym('>') => (&[">"], 1),
            Token::Word(w) if w == "not" && word(i + 1, "in") => (&["not in"], 2),
            Token::Word(w) if w == "in" => (&["in"], 1),
            Token::Word(w) if w == "between" => (&[">=", "<="], 1),
            Token::Word(w) if w == "is" && word(i + 1, "not") && word(i + 2, "null") => (&["is not null"], 3),
            Token::Word(w) if w == "is" && word(i + 1, "null") => (&["is null"], 2),
            _ => (&[], 1),
        };
        ops.extend(op);
        i += len;
    }
    ops
}

/// A column default as both stores can agree on it: without casts
/// (`'{}'::text`), outer parentheses or case, and flags as `true`/`false`.
pub fn default(raw: &str, boolean: bool) -> String {
    let mut text = raw.trim().to_owned();
    while text.starts_with('(') && text.ends_with(')') && balanced(&tokens(&text)).len() + 2 == tokens(&text).len() {
        text = text[1..text.len() - 1].trim().to_owned();
    }
    // `'x'::text`, `'-1'::integer`, `now()::timestamp with time zone`.
    let text = match text.find("::") {
        Some(at) if !text[at..].contains('\'') => text[..at].to_owned(),
        _ => text,
    };
    let unquoted = text.trim_matches('\'');
    let text = if unquoted.parse::<f64>().is_ok() { unquoted.to_owned() } else { text };
    match (boolean, text.to_lowercase().as_str()) {
        (true, "0" | "false") => "false".into(),
        (true, "1" | "true") => "true".into(),
        (_, "current_timestamp" | "now()" | "transaction_timestamp()") => "now()".into(),
        _ => text,
    }
}

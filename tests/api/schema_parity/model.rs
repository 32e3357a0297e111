//! The neutral model of a schema both catalog readers fill in, and its
//! comparison: every difference, each named by where it is and what each
//! store says.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::sql_text::Rule;

#[derive(Debug, Default)]
pub struct Schema {
    pub tables: BTreeMap<String, Table>,
}

#[derive(Debug, Default)]
pub struct Table {
    pub columns: BTreeMap<String, Column>,
    /// Whether the store checks the columns' types: always on PostgreSQL,
    /// only for STRICT tables on SQLite (which otherwise stores a string
    /// in an integer column without a word).
    pub typed: bool,
    pub primary_key: Vec<String>,
    /// Unique constraints and indexes (not the primary key's), by their
    /// columns in order, each with ` desc` when it is descending: SQLite
    /// names a unique constraint's index itself (`sqlite_autoindex_*`).
    pub indexes: BTreeMap<Vec<String>, Index>,
    /// By their columns in order.
    pub foreign_keys: BTreeMap<Vec<String>, ForeignKey>,
    /// By the columns each names.
    pub checks: BTreeSet<(BTreeSet<String>, Rule)>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Column {
    pub ty: Type,
    pub not_null: bool,
    pub default: Option<String>,
}

/// A column's type, mapped between the stores (see each reader).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Type {
    Integer,
    /// PostgreSQL's `boolean`; SQLite's `integer` with `check (x in (0, 1))`.
    Boolean,
    /// Text, JSON documents and (on PostgreSQL `timestamptz`) times.
    Text,
    Real,
    Blob,
    /// Anything the mapping does not know, as the store names it: always a
    /// difference, to be mapped or fixed.
    Other(String),
}

#[derive(Debug, PartialEq, Eq)]
pub struct Index {
    /// Null for an index that backs a unique constraint.
    pub name: Option<String>,
    pub unique: bool,
    /// The predicate of a partial index: the columns and rule it names.
    pub predicate: Option<(BTreeSet<String>, Rule)>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct ForeignKey {
    pub table: String,
    pub columns: Vec<String>,
    /// `cascade`, `restrict`, `no action`, `set null` or `set default`.
    pub on_delete: String,
    pub on_update: String,
}

/// One difference: `subject` says where (`table.column type`, a table's
/// index on some columns), then what each store says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    pub subject: String,
    pub sqlite: String,
    pub postgres: String,
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: SQLite {}; PostgreSQL {}", self.subject, self.sqlite, self.postgres)
    }
}

/// Every difference between the two schemas. An empty schema on either
/// side is a difference too: a reader that found nothing must not pass.
pub fn compare(sqlite: &Schema, postgres: &Schema) -> Vec<Drift> {
    let mut out = Vec::new();
    for (store, schema) in [("SQLite", sqlite), ("PostgreSQL", postgres)] {
        if schema.tables.is_empty() {
            out.push(Drift::new("schema", sided(store, "has no tables", "has tables")));
        }
    }
    both(&sqlite.tables, &postgres.tables, &mut out, |name| format!("table {name}"), compare_table);
    out
}

fn sided(store: &str, this: &str, other: &str) -> (String, String) {
    if store == "SQLite" { (this.into(), other.into()) } else { (other.into(), this.into()) }
}

impl Drift {
    fn new(subject: impl Into<String>, (sqlite, postgres): (String, String)) -> Drift {
        Drift { subject: subject.into(), sqlite, postgres }
    }
}

/// Reports what is in one map only under `subject(key)`, and runs `same`
/// on what is in both.
fn both<K: Ord + Clone, V>(
    a: &BTreeMap<K, V>,
    b: &BTreeMap<K, V>,
    out: &mut Vec<Drift>,
    subject: impl Fn(&K) -> String,
    mut same: impl FnMut(&K, &V, &V, &mut Vec<Drift>),
) {
    let keys: BTreeSet<&K> = a.keys().chain(b.keys()).collect();
    for key in keys {
        match (a.get(key), b.get(key)) {
            (Some(x), Some(y)) => same(key, x, y, out),
            (Some(_), None) => out.push(Drift::new(subject(key), ("has it".into(), "has none".into()))),
            (None, Some(_)) => out.push(Drift::new(subject(key), ("has none".into(), "has it".into()))),
            (None, None) => unreachable!("a key of neither map"),
        }
    }
}

/// Pushes a drift when `a` and `b` differ, shown with `Debug`.
fn differ<T: PartialEq + fmt::Debug>(out: &mut Vec<Drift>, subject: String, a: &T, b: &T) {
    if a != b {
        out.push(Drift::new(subject, (format!("{a:?}"), format!("{b:?}"))));
    }
}

fn compare_table(name: &String, a: &Table, b: &Table, out: &mut Vec<Drift>) {
    if a.columns.is_empty() || b.columns.is_empty() {
        out.push(Drift::new(format!("table {name}"), ("columns".into(), "read as none".into())));
    }
    differ(out, format!("table {name} typed"), &a.typed, &b.typed);
    both(
        &a.columns,
        &b.columns,
        out,
        |c| format!("{name}.{c}"),
        |c, x, y, out| {
            differ(out, format!("{name}.{c} type"), &x.ty, &y.ty);
            differ(out, format!("{name}.{c} not null"), &x.not_null, &y.not_null);
            differ(out, format!("{name}.{c} default"), &x.default, &y.default);
        },
    );
    differ(out, format!("table {name} primary key"), &a.primary_key, &b.primary_key);
    let index = |cols: &Vec<String>| format!("{name} index on ({})", cols.join(", "));
    both(&a.indexes, &b.indexes, out, index, |cols, x, y, out| {
        if x.name.is_some() && y.name.is_some() {
            differ(out, format!("{} name", index(cols)), &x.name, &y.name);
        }
        differ(out, format!("{} unique", index(cols)), &x.unique, &y.unique);
        differ(out, format!("{} predicate", index(cols)), &x.predicate, &y.predicate);
    });
    let fk = |cols: &Vec<String>| format!("{name} foreign key ({})", cols.join(", "));
    both(&a.foreign_keys, &b.foreign_keys, out, fk, |cols, x, y, out| differ(out, fk(cols), x, y));
    let checks = |t: &Table| t.checks.iter().map(|c| (c.clone(), ())).collect::<BTreeMap<_, _>>();
    let check = |(cols, rule): &(BTreeSet<String>, Rule)| {
        let cols: Vec<&str> = cols.iter().map(String::as_str).collect();
        format!("{name}.{} check {rule}", cols.join("+"))
    };
    both(&checks(a), &checks(b), out, check, |_, (), (), _| {});
}

impl Table {
    /// Adds an index; a second one on the same columns is kept apart
    /// (its last column marked), not lost.
    pub fn add_index(&mut self, mut columns: Vec<String>, index: Index) {
        while self.indexes.contains_key(&columns) {
            match columns.last_mut() {
                Some(last) => last.push_str(" (again)"),
                None => columns.push("(again)".into()),
            }
        }
        self.indexes.insert(columns, index);
    }
}

impl Schema {
    /// How many of each kind of thing the reader found: a kind read as
    /// none on both stores would compare equal and prove nothing.
    pub fn found(&self) -> Vec<(&'static str, usize)> {
        let t = || self.tables.values();
        let columns = || t().flat_map(|t| t.columns.values());
        vec![
            ("tables", t().count()),
            ("columns", columns().count()),
            ("flags", columns().filter(|c| c.ty == Type::Boolean).count()),
            ("defaults", columns().filter(|c| c.default.is_some()).count()),
            ("primary keys", t().filter(|t| !t.primary_key.is_empty()).count()),
            ("indexes", t().map(|t| t.indexes.len()).sum()),
            ("partial indexes", t().flat_map(|t| t.indexes.values()).filter(|i| i.predicate.is_some()).count()),
            ("unique constraints", t().flat_map(|t| t.indexes.values()).filter(|i| i.name.is_none()).count()),
            ("foreign keys", t().map(|t| t.foreign_keys.len()).sum()),
            ("checks", t().map(|t| t.checks.len()).sum()),
        ]
    }

    /// Forgets what cannot differ in effect: whether a JSON check admits
    /// null on a column that is not null anyway.
    pub fn normalise(mut self) -> Schema {
        for table in self.tables.values_mut() {
            let not_null = |c: &String| table.columns.get(c).is_some_and(|c| c.not_null);
            table.checks = std::mem::take(&mut table.checks)
                .into_iter()
                .map(|(cols, rule)| match rule {
                    Rule::Json { .. } if cols.iter().all(not_null) => (cols, Rule::Json { admits_null: false }),
                    rule => (cols, rule),
                })
                .collect();
        }
        self
    }
}

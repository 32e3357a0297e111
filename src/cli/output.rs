//! What the client prints: aligned tables and `key: value` blocks for
//! people, or the server's JSON, pretty-printed, for scripts. Results go to
//! standard output; progress and errors go to standard error, so that
//! `-o json | jq` always sees one JSON document.

use clap::ValueEnum;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::client::{CliError, Client};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns for people.
    Table,
    /// The server's JSON, pretty-printed.
    Json,
}

/// Prints `value` as pretty JSON.
pub fn print_json(value: &Value) {
    match serde_json::to_string_pretty(value) {
        Ok(s) => println!("{s}"),
        // Serializing a `Value` cannot fail; keep the output parseable anyway.
        Err(_) => println!("{value}"),
    }
}

/// How the server names an enum value (`rolled_back`, `kube-apiserver`).
pub fn wire_name<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".to_owned(),
    }
}

/// An optional value as display text, `-` when absent.
pub fn or_dash<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".to_owned(), T::to_string)
}

/// A table with a header row; columns are as wide as their widest cell.
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        Self { rows: vec![headers.iter().map(|h| (*h).to_owned()).collect()] }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|i| self.rows.iter().filter_map(|r| r.get(i)).map(|c| c.chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, c) in row.iter().enumerate() {
                let pad = widths.get(i).copied().unwrap_or(0);
                line.push_str(&format!("{c:<pad$}  "));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// A list's table, with a NAMESPACE column first when the list spans
/// namespaces (`-n '*'`), as `kubectl get -A` shows it.
pub struct ListTable {
    table: Table,
    across: bool,
}

impl ListTable {
    pub fn new(across: bool, headers: &[&str]) -> Self {
        let mut all = Vec::with_capacity(headers.len() + 1);
        if across {
            all.push("NAMESPACE");
        }
        all.extend_from_slice(headers);
        Self { table: Table::new(&all), across }
    }

    pub fn row(&mut self, namespace: &impl std::fmt::Display, cells: Vec<String>) {
        let row = if self.across { std::iter::once(namespace.to_string()).chain(cells).collect() } else { cells };
        self.table.row(row);
    }

    pub fn print(&self) {
        self.table.print();
    }
}

/// `key: value` lines, keys aligned.
pub fn print_fields(fields: &[(&str, String)]) {
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    for (k, v) in fields {
        println!("{:<width$} {v}", format!("{k}:"));
    }
}

/// An answer as the server's JSON, or read as its view type `T` and shown
/// to a person by `table`.
pub fn show<T: DeserializeOwned + Serialize>(
    out: OutputFormat,
    what: &str,
    answer: Value,
    table: impl FnOnce(T),
) -> Result<(), CliError> {
    match out {
        OutputFormat::Json => print_json(&answer),
        OutputFormat::Table => table(Client::decode(what, answer)?),
    }
    Ok(())
}

/// Tells a person how to get the next page, on standard error.
pub fn more_hint(next_cursor: &Option<String>) {
    if let Some(cursor) = next_cursor {
        eprintln!("(more: repeat with --cursor {cursor})");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_trim_line_ends() {
        let mut t = Table::new(&["NAME", "READY"]);
        t.row(vec!["workers".into(), "3/3".into()]);
        t.row(vec!["a".into(), "-".into()]);
        assert_eq!(t.render(), "NAME     READY\nworkers  3/3\na        -\n");
    }

    #[test]
    fn enums_show_their_wire_names_and_nothing_shows_as_a_dash() {
        assert_eq!(wire_name(&crate::domain::upgrade::JobState::Running), "running");
        assert_eq!((or_dash(&Some(3)), or_dash::<u32>(&None)), ("3".into(), "-".into()));
    }
}
